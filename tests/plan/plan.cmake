# The dry-run planner (engine/plan/). Unit tests: model arithmetic and cluster profiles,
# throughput against published runs, the CLI's table/JSON/trace/ranks, and a timing print.
tpd_add_gtest(test_plan LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_plan_model.cc
          ${CMAKE_CURRENT_LIST_DIR}/test_plan_throughput.cc
          ${CMAKE_CURRENT_LIST_DIR}/test_plan_cli.cc
  LIBS tpd_engine)
tpd_add_gtest(test_plan_bench LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_plan_bench.cc
  LIBS tpd_engine)
