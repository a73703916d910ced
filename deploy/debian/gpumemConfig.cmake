# find_package(gpumem) for gpumemd's client library (C ABI, gpumem.h):
#   find_package(gpumem 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE gpumem::gpumem)
# Defines the imported target gpumem::gpumem (libgpumem.so.1 and the
# directory of gpumem.h) and gpumem_VERSION. Paths are found from this file's
# own place (lib/<multiarch>/cmake/gpumem), so a copy under another prefix
# works too.
get_filename_component(_gpumem_libdir "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
get_filename_component(_gpumem_prefix "${_gpumem_libdir}/../.." ABSOLUTE)
if(NOT EXISTS "${_gpumem_libdir}/libgpumem.so.1" OR
   NOT EXISTS "${_gpumem_prefix}/include/gpumem.h")
  set(gpumem_FOUND FALSE)
  set(gpumem_NOT_FOUND_MESSAGE
      "gpumem: ${_gpumem_libdir}/libgpumem.so.1 or ${_gpumem_prefix}/include/gpumem.h is missing (apt install libgpumem-dev)")
  return()
endif()
if(NOT TARGET gpumem::gpumem)
  add_library(gpumem::gpumem SHARED IMPORTED)
  set_target_properties(gpumem::gpumem PROPERTIES
    IMPORTED_LOCATION "${_gpumem_libdir}/libgpumem.so.1"
    IMPORTED_SONAME "libgpumem.so.1"
    INTERFACE_INCLUDE_DIRECTORIES "${_gpumem_prefix}/include")
endif()
unset(_gpumem_libdir)
unset(_gpumem_prefix)
