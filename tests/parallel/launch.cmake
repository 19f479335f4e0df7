add_test(NAME launch_checks
         COMMAND ${CMAKE_CURRENT_LIST_DIR}/launch_checks.sh $<TARGET_FILE:tripod> ${CMAKE_SOURCE_DIR})
set_tests_properties(launch_checks PROPERTIES LABELS mpi TIMEOUT 300)
