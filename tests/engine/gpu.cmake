# The cuda backend in the training loop; skips without a device.
if(TRIPOD_HAVE_CUDA)
  tpd_add_gtest(test_gpu_train LABEL gpu TIMEOUT 600
                SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpu_train.cc LIBS tpd_engine MPI::MPI_C)
endif()
