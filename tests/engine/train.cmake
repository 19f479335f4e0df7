tpd_add_gtest(test_model_grad LABEL unit
              SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model_grad.cc LIBS tpd_engine)
tpd_add_gtest(test_train LABEL unit
              SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_train.cc LIBS tpd_engine MPI::MPI_C)
