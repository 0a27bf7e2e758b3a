# peer_env.sh — sourced by the benchmarks that run a PyTorch peer: the
# environment that makes the peer's OpenBLAS the one bigbatch runs
# (ARCHITECTURE.md, "Facts measured"): the pthread build of OpenBLAS, a
# passive OpenMP wait policy, and, when OpenBLAS picks generic kernels on
# this CPU (Debian's 0.3.21 says "Prescott" on some Xeons), the same
# OPENBLAS_CORETYPE that bigbatch restarts itself with. Without the last
# one PyTorch ran ~3x slower than it can on such a machine.
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=PASSIVE
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    core=$(/usr/bin/python3 -c 'import ctypes
l = ctypes.CDLL("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
l.openblas_get_corename.restype = ctypes.c_char_p
print(l.openblas_get_corename().decode())' 2>/dev/null || echo unknown)
    case "${core,,}" in
    prescott | core2 | penryn | dunnington | nehalem | atom | katmai | coppermine | northwood | banias | unknown)
        if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
        elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi ;;
    esac
    echo "# OpenBLAS core: $core${OPENBLAS_CORETYPE:+ -> OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE for both sides}" >&2
fi
