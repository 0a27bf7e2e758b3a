#!/usr/bin/env bash
# stream_start.sh — how soon training on a remote dataset takes its first
# step: bigbatch streaming the training shards (the default) against
# bigbatch with --wait-for-data (every shard mirrored first: what it did
# before) and against `curl` fetching the same files four at a time (what
# any loader that needs whole files waits at least). The dataset: MB
# megabytes of random bytes packed as 256-token windows (random bytes do
# not compress: the shards are about as large), in shards of SHARD_MB MiB, served
# by nginx on loopback at RATE per connection (nginx's limit_rate: a slow
# link; bigbatch and curl both open four connections). Each run starts
# from an empty cache and trains one step of a small GPT with windows of 8
# frames (--shuffle-frames 8, what a dataset past the 1 GiB --shuffle-memory
# gets; a smaller one is shuffled whole, and its first step needs every
# frame). RUNS rounds (default 5), the three interleaved; medians and the
# ratios printed.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
MB=${MB:-192}
SHARD_MB=${SHARD_MB:-16}
RATE=${RATE:-8m}
BIN=$PWD/bin/bigbatch
make --no-print-directory all >/dev/null
work=$(mktemp -d)
nginx_pid=
cleanup() { [ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
chmod 755 "$work"
head -c $((MB * 1000000)) /dev/urandom >"$work/text.txt"
"$BIN" pack --format text --in "$work/text.txt" --seq-len 256 --shard-mib "$SHARD_MB" --out "$work/www/ds" >/dev/null
rm "$work/text.txt"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
user=""
[ "$(id -u)" = 0 ] && user="user root;"
cat >"$work/nginx.conf" <<EOF
daemon off; $user worker_processes 1; pid $work/nginx.pid; error_log $work/error.log;
events {}
http { access_log off; client_body_temp_path $work; proxy_temp_path $work; fastcgi_temp_path $work;
       uwsgi_temp_path $work; scgi_temp_path $work;
       server { listen 127.0.0.1:$port; root $work/www; limit_rate $RATE; } }
EOF
/usr/sbin/nginx -q -p "$work" -c "$work/nginx.conf" &
nginx_pid=$!
for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/ds/index.json" && break; sleep 0.05; done
url="http://127.0.0.1:$port/ds/"
files=$(python3 -c "import json,sys; print(' '.join(f['name'] for f in json.load(open('$work/www/ds/index.json'))['files']))")
bytes=$(du -sb "$work/www/ds" | cut -f1)

train() { # $1: cache; the rest: extra flags
    local cache=$1
    shift
    "$BIN" train --data "$url" --cache-dir "$cache" --layers 1 --d-model 64 --heads 2 --global-batch 8 \
        --micro-batch 8 --steps 1 --shuffle-frames 8 --quiet "$@"
}
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); awk "BEGIN { print $t1 - $t0 }"; }
curl_all() {
    local dir=$1 args=()
    mkdir -p "$dir"
    for f in $files; do args+=(-o "$dir/$f" "$url$f"); done
    curl -sf --no-progress-meter --parallel --parallel-immediate --parallel-max 4 "${args[@]}"
}
declare -a s w c
for r in $(seq "$RUNS"); do
    s+=("$(seconds train "$work/cache-s$r")")
    w+=("$(seconds train "$work/cache-w$r" --wait-for-data)")
    c+=("$(seconds curl_all "$work/curl$r")")
    rm -rf "$work/cache-s$r" "$work/cache-w$r" "$work/curl$r"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ms=$(median "${s[@]}") mw=$(median "${w[@]}") mc=$(median "${c[@]}")
echo "stream_start: $(nproc) cores, $(date -u +%F), $RUNS runs, dataset $((bytes / 1000000)) MB in" \
    "$(ls "$work/www/ds"/*.bbs | wc -l) shards of ~$SHARD_MB MiB, nginx limit_rate $RATE per connection"
printf '  %-34s %8s  %s\n' "start" "first step (s, median)" "runs"
printf '  %-34s %8.2f  %s\n' "bigbatch, streamed (default)" "$ms" "${s[*]}"
printf '  %-34s %8.2f  %s\n' "bigbatch --wait-for-data" "$mw" "${w[*]}"
printf '  %-34s %8.2f  %s\n' "curl, every file (4 at once)" "$mc" "${c[*]}"
awk -v s="$ms" -v w="$mw" -v c="$mc" 'BEGIN { printf "  streamed first step: %.1fx sooner than --wait-for-data, " \
    "%.1fx sooner than curl alone\n", w / s, c / s }' 
