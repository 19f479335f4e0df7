tpd_add_gtest(test_model_grad LABEL unit
              SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model_grad.cc LIBS tpd_engine)
tpd_add_gtest(test_train LABEL unit
              SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_train.cc LIBS tpd_engine MPI::MPI_C)
# One test runs the binary: build it first.
target_compile_definitions(test_train PRIVATE TPD_TRIPOD_BIN="$<TARGET_FILE:tripod>")
add_dependencies(test_train tripod)
