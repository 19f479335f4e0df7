# Pipeline schedules (parallel/pipeline/schedule.c): pure action lists and the simulator.
# The test compiles schedule.c directly so it needs nothing but tpd_base (no MPI, no
# kernels): the schedules are pure functions.
tpd_add_gtest(test_schedule LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_schedule.cc
          ${PROJECT_SOURCE_DIR}/parallel/pipeline/schedule.c
  LIBS tpd_base)
