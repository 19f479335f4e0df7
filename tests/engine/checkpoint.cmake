# Checkpoints: resume, integrity, signals and interchange on one rank (unit); resharding
# across layouts inside one mpirun (mpi); SIGTERM to a `tripod train` under mpirun (mpi).
tpd_add_gtest(test_checkpoint LABEL unit
              SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint.cc LIBS tpd_engine MPI::MPI_C)
tpd_add_gtest(test_checkpoint_interchange LABEL unit
              SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_interchange.cc
              LIBS tpd_engine MPI::MPI_C)
add_executable(test_checkpoint_reshard ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_reshard.cc)
target_link_libraries(test_checkpoint_reshard PRIVATE tpd_engine MPI::MPI_C GTest::gtest)
tpd_add_mpi_test(checkpoint_reshard_np8 NP 8 TIMEOUT 300
                 COMMAND $<TARGET_FILE:test_checkpoint_reshard>)
add_test(NAME checkpoint_sigterm_mpirun
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/ckpt_sigterm.sh $<TARGET_FILE:tripod> ${MPIEXEC_EXECUTABLE})
set_tests_properties(checkpoint_sigterm_mpirun PROPERTIES LABELS mpi TIMEOUT 120)
# `tripod eval` of a saved checkpoint, on one rank and resharded under mpirun.
add_test(NAME eval_flow
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/eval_flow.sh $<TARGET_FILE:tripod> ${MPIEXEC_EXECUTABLE}
                 ${CMAKE_SOURCE_DIR})
set_tests_properties(eval_flow PROPERTIES LABELS mpi TIMEOUT 120)
