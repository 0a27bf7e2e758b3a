#!/usr/bin/env bash
# run_suites.sh — runs Criterion suites in parallel (make check, make
# check-tests): JOBS suites at a time (default: the CPUs), each with its
# own cache directory, temporary directory and log, then prints for each
# suite its time and everything but its passing lines (failures, skips with
# their reasons, the suites' own notes), and fails when a suite failed, a
# sanitizer spoke or a suite left files in its temporary directory.
#
#   tests/run_suites.sh BIGBATCH_BIN SUITE...   (JOBS=N suites at once, SUITE_JOBS=N tests of a
#                                               suite at once (default 2), TEST_ARGS="...")
set -uo pipefail
bin=$1
shift
jobs=${JOBS:-$(nproc)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export BIGBATCH_BIN=$bin
# The suites call the library without bigbatch's main(), which restarts
# itself with OPENBLAS_CORETYPE where OpenBLAS takes this CPU for an old one
# (generic kernels: fp32 products 3-4x slower): they get the same setting.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    core=$("$bin" version 2> /dev/null | sed -n 's/^cpu: .*(OPENBLAS_CORETYPE=\([A-Za-z0-9]*\)).*/\1/p')
    if [ -n "$core" ]; then export OPENBLAS_CORETYPE=$core; fi
fi
run_one() { # suite, index
    local t=$1 i=$2 start=$SECONDS
    mkdir -p "$dir/tmp.$i"
    TMPDIR=$dir/tmp.$i BB_CACHE_DIR=$dir/cache.$i "$t" --jobs "${SUITE_JOBS:-2}" --verbose ${TEST_ARGS:-} > "$dir/$i.log" 2>&1
    echo "$? $((SECONDS - start))" > "$dir/$i.rc"
}
export -f run_one
export dir
i=0
for t in "$@"; do echo "$t $i"; i=$((i + 1)); done | xargs -P "$jobs" -n 2 bash -c 'run_one "$0" "$1"'
failed=() i=0
for t in "$@"; do
    read -r rc seconds < "$dir/$i.rc" || rc=1 seconds=?
    echo "== $t (${seconds} s)"
    grep -a -v -E '^\[(RUN |PASS)\]|^\[----\] Criterion v|^\[====\] Running' "$dir/$i.log"
    if grep -a -q -E 'ERROR: (Leak|Address|Thread)Sanitizer|WARNING: ThreadSanitizer|runtime error:' "$dir/$i.log"; then
        echo "FAILED: a sanitizer reported an error in $t"
        failed+=("$(basename "$t") (sanitizer)")
    fi
    left=$(ls -A "$dir/tmp.$i" 2> /dev/null | head -3 | tr '\n' ' ')
    if [ -n "$left" ]; then
        echo "FAILED: $t left files in its temporary directory: $left"
        failed+=("$(basename "$t") (left files: $left)")
    fi
    [ "$rc" = 0 ] || failed+=("$(basename "$t") (exit $rc)")
    i=$((i + 1))
done
# The summary names each failed suite: a log's tail shows which, however long the output above.
if [ ${#failed[@]} -ne 0 ]; then
    echo "FAILED: ${#failed[@]} suite(s): ${failed[*]}"
    exit 1
fi
echo "all suites passed"
