# Tests of the cpu (fp32) kernel backend.
tpd_add_gtest(test_cpu_kernels LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_kernels.cc
  LIBS tpd_kernels)
tpd_add_gtest(test_cpu_grad LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cpu_grad.cc
  LIBS tpd_kernels)
