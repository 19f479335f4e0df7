tpd_add_gtest(test_mesh LABEL unit SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mesh.cc
              LIBS tpd_parallel)
