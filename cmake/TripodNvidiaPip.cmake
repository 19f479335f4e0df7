# tpd_nvidia_pip_roots(OUT COMPONENT): the roots of Python's nvidia.* wheels for one NVIDIA
# library (cudnn, nccl), for FindCUDNN and FindNCCL.
#
# The wheels (nvidia-cudnn-cu13, nvidia-nccl-cu13, ...) install into
# <site-packages>/nvidia/<component>/ (or nvidia/<cuXY>/ in the CUDA 13 layout) a lib/ with
# versioned sonames only (libcudnn.so.9, libnccl.so.2) and an include/ with the headers.
# A machine whose cuDNN and NCCL come only from pip (for PyTorch) has nothing else.
#
# The site-packages folders searched are TRIPOD_PYTHON_SITE (a CMake or environment list,
# so the search can be pointed at a folder without any Python installed), then every entry
# of sys.path of the first python3 found (which includes PYTHONPATH and the user site).
# Only roots that hold a lib/ folder are returned, the component's own one first.

function(tpd_nvidia_pip_roots out component)
  set(_sites ${TRIPOD_PYTHON_SITE} $ENV{TRIPOD_PYTHON_SITE})
  string(REPLACE ":" ";" _sites "${_sites}")
  if(NOT TRIPOD_NO_PYTHON_SEARCH)
    find_program(TPD_PYTHON3 NAMES python3 python)
    mark_as_advanced(TPD_PYTHON3)
    if(TPD_PYTHON3)
      execute_process(
        COMMAND ${TPD_PYTHON3} -c "import sys; print(';'.join(p for p in sys.path if p))"
        OUTPUT_VARIABLE _py_path OUTPUT_STRIP_TRAILING_WHITESPACE
        ERROR_QUIET TIMEOUT 20)
      list(APPEND _sites ${_py_path})
    endif()
  endif()
  set(_roots "")
  foreach(_s IN LISTS _sites)
    if(NOT IS_DIRECTORY "${_s}/nvidia")
      continue()
    endif()
    if(IS_DIRECTORY "${_s}/nvidia/${component}/lib")
      list(APPEND _roots "${_s}/nvidia/${component}")
    endif()
    file(GLOB _cu "${_s}/nvidia/cu[0-9]*")
    foreach(_r IN LISTS _cu)
      if(IS_DIRECTORY "${_r}/lib")
        list(APPEND _roots "${_r}")
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES _roots)
  set(${out} ${_roots} PARENT_SCOPE)
endfunction()

# tpd_find_nvidia_lib(PREFIX HEADER COMPONENT NAMES...): sets the cache variables
# <PREFIX>_INCLUDE_DIR (the folder of HEADER) and <PREFIX>_LIBRARY (the first of NAMES, which
# may be versioned file names such as libcudnn.so.9).
#
# Searched in order: <PREFIX>_ROOT and $ENV{<PREFIX>_ROOT} (and the extra ARGN hints), next to
# the CUDA toolkit, the system paths, then the pip wheels (tpd_nvidia_pip_roots). The header
# and the library come from the same place: the pip roots are tried only when the first
# search found neither, so a system header is never paired with a pip library.
function(tpd_find_nvidia_lib prefix header component)
  cmake_parse_arguments(A "" "" "NAMES;HINTS" ${ARGN})
  set(_hints ${${prefix}_ROOT} $ENV{${prefix}_ROOT} ${A_HINTS})
  if(CUDAToolkit_LIBRARY_ROOT)
    list(APPEND _hints ${CUDAToolkit_LIBRARY_ROOT})
  endif()
  foreach(_d ${CUDAToolkit_INCLUDE_DIRS})
    get_filename_component(_p "${_d}/.." ABSOLUTE)
    list(APPEND _hints ${_p})
  endforeach()
  set(_inc_suffixes include include/x86_64-linux-gnu)
  set(_lib_suffixes lib64 lib lib/x86_64-linux-gnu)

  find_path(${prefix}_INCLUDE_DIR ${header}
    HINTS ${_hints} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES ${_inc_suffixes})
  find_library(${prefix}_LIBRARY NAMES ${A_NAMES}
    HINTS ${_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES ${_lib_suffixes})
  if(NOT ${prefix}_INCLUDE_DIR AND NOT ${prefix}_LIBRARY)
    tpd_nvidia_pip_roots(_pip ${component})
    if(_pip)
      find_path(${prefix}_INCLUDE_DIR ${header}
        PATHS ${_pip} PATH_SUFFIXES include NO_DEFAULT_PATH)
      find_library(${prefix}_LIBRARY NAMES ${A_NAMES}
        PATHS ${_pip} PATH_SUFFIXES lib NO_DEFAULT_PATH)
      if(${prefix}_LIBRARY)
        message(STATUS "${prefix}: from Python's nvidia.${component} wheel: ${${prefix}_LIBRARY}")
      endif()
    endif()
  endif()
endfunction()

# tpd_header_version(OUT FILE MAJOR MINOR PATCH): "MAJOR.MINOR.PATCH" from the #defines named
# by the last three arguments in FILE (empty when FILE is missing).
function(tpd_header_version out file major minor patch)
  set(${out} "" PARENT_SCOPE)
  if(NOT EXISTS "${file}")
    return()
  endif()
  file(READ "${file}" _h)
  set(_v "")
  foreach(_name ${major} ${minor} ${patch})
    string(REGEX MATCH "define ${_name} +([0-9]+)" _ "${_h}")
    list(APPEND _v "${CMAKE_MATCH_1}")
  endforeach()
  list(JOIN _v "." _v)
  set(${out} "${_v}" PARENT_SCOPE)
endfunction()
