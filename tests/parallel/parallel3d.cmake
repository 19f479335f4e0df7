# The equivalence matrix: every layout with TP in {1,2,4}, PP in {1,2,4}, DP in
# {1,2,4,8}, TP*PP*DP <= 8, ZeRO-1 off and on, against the single-rank run.
add_executable(test_equivalence ${CMAKE_CURRENT_LIST_DIR}/test_equivalence.cc)
target_link_libraries(test_equivalence PRIVATE tpd_engine MPI::MPI_C GTest::gtest)
tpd_add_mpi_test(equivalence_matrix_np8 NP 8 TIMEOUT 900 COMMAND $<TARGET_FILE:test_equivalence>)
if(TRIPOD_HAVE_CUDA)
  # TP=2, PP=2, DP=2 on one GPU shared by 8 ranks (host-staged communicators).
  add_test(NAME equivalence_cuda_np8
           COMMAND ${TPD_MPIRUN} -np 8 $<TARGET_FILE:test_equivalence> --device=cuda
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(equivalence_cuda_np8 PROPERTIES LABELS gpu TIMEOUT 600)
endif()
