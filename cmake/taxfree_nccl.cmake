# NCCL as the imported target taxfree::nccl, for the build and for taxfreeConfig.cmake alike. The
# headers compiled against must match the library loaded at run time (the Team checks at start:
# ncclGetVersion against NCCL_VERSION_CODE). Where NCCL is not beside CUDA: NCCL_ROOT or CMAKE_PREFIX_PATH.
if(NOT TARGET taxfree::nccl)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include REQUIRED)
  find_library(NCCL_LIBRARY nccl HINTS ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}
               PATH_SUFFIXES lib lib64 REQUIRED)
  add_library(taxfree::nccl UNKNOWN IMPORTED)
  set_target_properties(taxfree::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                                 INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
