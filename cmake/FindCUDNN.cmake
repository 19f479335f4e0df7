# FindCUDNN: locates cuDNN 9 (the graph/backend API) and defines the imported target
# CUDNN::CUDNN.
#
# Looks in CUDNN_ROOT / $ENV{CUDNN_ROOT} / $ENV{CUDNN_PATH}, next to the CUDA toolkit (a
# tarball often lands there), in the system paths (Debian packages put the header in
# /usr/include and the library in /usr/lib/<triplet>), then in Python's nvidia-cudnn wheel,
# which has only the versioned libcudnn.so.9 (see TripodNvidiaPip.cmake).
#
# Result variables: CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION.
include(${CMAKE_CURRENT_LIST_DIR}/TripodNvidiaPip.cmake)

tpd_find_nvidia_lib(CUDNN cudnn_version.h cudnn NAMES cudnn libcudnn.so.9 HINTS $ENV{CUDNN_PATH})
tpd_header_version(CUDNN_VERSION "${CUDNN_INCLUDE_DIR}/cudnn_version.h"
  CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(CUDNN
  REQUIRED_VARS CUDNN_LIBRARY CUDNN_INCLUDE_DIR
  VERSION_VAR CUDNN_VERSION)

if(CUDNN_FOUND AND NOT TARGET CUDNN::CUDNN)
  add_library(CUDNN::CUDNN UNKNOWN IMPORTED)
  set_target_properties(CUDNN::CUDNN PROPERTIES
    IMPORTED_LOCATION "${CUDNN_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
endif()
mark_as_advanced(CUDNN_INCLUDE_DIR CUDNN_LIBRARY)
