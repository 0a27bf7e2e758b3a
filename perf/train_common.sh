# train_common.sh — helpers that train_bench.sh, mpi_bench.sh and
# ab_bench.sh share (sourced; they set PY first).
# steady FILE KEY: the median of KEY over steps 3.. of a --metrics file (its rows: the lines with a step)
steady() { $PY -c 'import json,sys,statistics as s; r=[x for x in map(json.loads, open(sys.argv[1])) if "step" in x][2:]; print(s.median(x[sys.argv[2]] for x in r))' "$1" "$2"; }
# field KEY: KEY of the JSON object on stdin's last line
field() { $PY -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])[sys.argv[1]])' "$1"; }
# median X...: of the arguments
median() { $PY -c 'import sys,statistics as s; print(s.median(float(x) for x in sys.argv[1:]))' "$@"; }
# r2 A B: A / B with two decimals
r2() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
