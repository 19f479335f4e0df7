# The equivalence matrix: every layout with TP in {1,2,4}, PP in {1,2,4}, DP in
# {1,2,4,8}, TP*PP*DP <= 8, ZeRO-1 off and on, against the single-rank run.
add_executable(test_equivalence ${CMAKE_CURRENT_LIST_DIR}/test_equivalence.cc)
target_link_libraries(test_equivalence PRIVATE tpd_engine MPI::MPI_C GTest::gtest)
tpd_add_mpi_test(equivalence_matrix_np8 NP 8 TIMEOUT 900 COMMAND $<TARGET_FILE:test_equivalence>)
