# GPU tests of the cuda kernel backend and the NCCL/staged communicators. Label gpu: each
# test skips when no CUDA device is visible, so the suite passes on machines without one.
if(TRIPOD_HAVE_CUDA)
  tpd_add_gtest(test_cuda_kernels LABEL gpu TIMEOUT 600
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda_kernels.cc
    LIBS tpd_kernels)

  # Own main (MPI_Init for the singleton world), so not through tpd_add_gtest.
  add_executable(test_cuda_nccl ${CMAKE_CURRENT_LIST_DIR}/test_cuda_nccl.cc)
  target_link_libraries(test_cuda_nccl PRIVATE tpd_parallel tpd_kernels CUDA::cudart
                        MPI::MPI_C GTest::gtest)
  gtest_discover_tests(test_cuda_nccl PROPERTIES LABELS gpu TIMEOUT 300
                       DISCOVERY_TIMEOUT 60
                       WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
endif()
