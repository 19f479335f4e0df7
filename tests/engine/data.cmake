# Token data sets, `tripod data prepare` and the data CLI. The suite compiles the data
# sources itself rather than linking tpd_engine, so it builds and runs without the rest
# of the engine (model, training loop, planner).
tpd_add_gtest(test_data LABEL unit TIMEOUT 60
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data.cc
          ${PROJECT_SOURCE_DIR}/engine/data.c
          ${PROJECT_SOURCE_DIR}/engine/data_prepare.c
          ${PROJECT_SOURCE_DIR}/engine/data_cli.c
  LIBS tpd_base)
