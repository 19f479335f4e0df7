# Run-time options of an ASan+UBSan build (-DTRIPOD_SANITIZE=ON or -DTRIPOD_FUZZ=ON):
#   source tests/sanitize/env.sh; ctest ...
# Leaks are checked, except allocations that Open MPI makes for itself and never frees
# (lsan.supp lists them by library). Open MPI unloads its components before LSan looks, so
# their frames are anonymous: the full (slow) unwinder at each malloc reaches past them
# into libmpi, which the suppressions name. A failed allocation returns NULL, as without ASan, so
# the code's own out-of-memory paths run; UBSan stops at the first report.
tpd_sanitize_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0:allocator_may_return_null=1:detect_stack_use_after_return=0:check_initialization_order=1
export LSAN_OPTIONS=suppressions=$tpd_sanitize_dir/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
unset tpd_sanitize_dir
