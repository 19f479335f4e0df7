# FindNCCL: locates NCCL (2.18 or newer, for ncclCommSplit) and defines the imported target
# NCCL::NCCL.
#
# Searched in NCCL_ROOT / $ENV{NCCL_ROOT} / $ENV{NCCL_HOME}, next to the CUDA toolkit (some
# installs put libnccl in <cuda>/lib rather than lib64), then in the system paths.
#
# Result variables: NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION.

set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()
if(CUDAToolkit_INCLUDE_DIRS)
  foreach(_d ${CUDAToolkit_INCLUDE_DIRS})
    get_filename_component(_p "${_d}/.." ABSOLUTE)
    list(APPEND _nccl_hints ${_p})
  endforeach()
endif()

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl
  HINTS ${_nccl_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(READ "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_h)
  string(REGEX MATCH "define NCCL_MAJOR ([0-9]+)" _ "${_nccl_h}")
  set(_nccl_major ${CMAKE_MATCH_1})
  string(REGEX MATCH "define NCCL_MINOR ([0-9]+)" _ "${_nccl_h}")
  set(_nccl_minor ${CMAKE_MATCH_1})
  string(REGEX MATCH "define NCCL_PATCH ([0-9]+)" _ "${_nccl_h}")
  set(_nccl_patch ${CMAKE_MATCH_1})
  set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
endif()

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
