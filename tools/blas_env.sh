# Sourced by the demo and benchmark scripts. Debian 12's OpenBLAS (0.3.21) picks its
# kernels from the CPU model; on CPUs it does not recognise (virtual machines that report
# a generic "Intel Xeon Processor") it falls back to its SSE3 kernels, about 3x slower
# than its AVX2/AVX-512 ones on the same machine. When the caller has not chosen, pick the
# kernels from the instruction sets the CPU reports. The test suite does not source this.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ -r /proc/cpuinfo ]; then
  if grep -qw avx512f /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi
