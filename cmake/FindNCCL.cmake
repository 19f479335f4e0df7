# FindNCCL: locates NCCL (2.18 or newer, for ncclCommSplit) and defines the imported target
# NCCL::NCCL.
#
# Looks in NCCL_ROOT / $ENV{NCCL_ROOT} / $ENV{NCCL_HOME}, next to the CUDA toolkit (some
# installs put libnccl in <cuda>/lib rather than lib64), in the system paths, then in
# Python's nvidia-nccl wheel, which has only the versioned libnccl.so.2 (see
# TripodNvidiaPip.cmake).
#
# Result variables: NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION.
include(${CMAKE_CURRENT_LIST_DIR}/TripodNvidiaPip.cmake)

tpd_find_nvidia_lib(NCCL nccl.h nccl NAMES nccl libnccl.so.2 HINTS $ENV{NCCL_HOME})
tpd_header_version(NCCL_VERSION "${NCCL_INCLUDE_DIR}/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
