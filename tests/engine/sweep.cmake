# The benchmark sweep, its real-run traces and the planner's calibration.
# mpi: a calibrated sweep of a small demo-like model on 4 ranks (files, losses against
# plain trainers, predicted vs measured step time); unit: profile round trip, fits and
# the planner's cpu time model.
add_executable(test_sweep ${CMAKE_CURRENT_LIST_DIR}/test_sweep.cc)
target_link_libraries(test_sweep PRIVATE tpd_engine MPI::MPI_C GTest::gtest)
tpd_add_mpi_test(sweep_calibrated_np4 NP 4 TIMEOUT 300 COMMAND $<TARGET_FILE:test_sweep>)
# timings: alone on the machine
set_tests_properties(sweep_calibrated_np4 PROPERTIES RUN_SERIAL TRUE)
tpd_add_gtest(test_sweep_unit LABEL unit
              SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sweep_unit.cc LIBS tpd_engine MPI::MPI_C)
