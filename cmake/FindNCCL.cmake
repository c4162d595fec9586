# FindNCCL: locates NVIDIA's NCCL (headers and shared library).
#
# Looked for, in this order:
#   1. NCCL_ROOT (CMake or environment variable): <root>/include, <root>/lib[64]
#   2. the Python package nvidia-nccl-cu12 (pip), found by asking the
#      interpreter for the path of `nvidia.nccl`; its library ships only as
#      libnccl.so.2 (no unversioned libnccl.so), so that name is searched too
#   3. the system paths (/usr, CUDA toolkit, ...)
#
# Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the
# imported target NCCL::NCCL.
include(FindPackageHandleStandardArgs)

set(_nccl_hints)
if(NCCL_ROOT)
  list(APPEND _nccl_hints ${NCCL_ROOT})
elseif(DEFINED ENV{NCCL_ROOT})
  list(APPEND _nccl_hints $ENV{NCCL_ROOT})
endif()

if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    # nvidia.nccl is a namespace package: no __file__, but a __path__.
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
      OUTPUT_VARIABLE _nccl_py_dir OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET RESULT_VARIABLE _nccl_py_rc)
    if(_nccl_py_rc EQUAL 0 AND IS_DIRECTORY "${_nccl_py_dir}")
      list(APPEND _nccl_hints ${_nccl_py_dir})
    endif()
  endif()
endif()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _nccl_hints ${CUDAToolkit_LIBRARY_ROOT})
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints}
             PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_major REGEX "^#define NCCL_MAJOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_minor REGEX "^#define NCCL_MINOR +[0-9]+")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_patch REGEX "^#define NCCL_PATCH +[0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _nccl_major "${_nccl_major}")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _nccl_minor "${_nccl_minor}")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _nccl_patch "${_nccl_patch}")
  set(NCCL_VERSION "${_nccl_major}.${_nccl_minor}.${_nccl_patch}")
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL SHARED IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
