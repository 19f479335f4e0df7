# Token data sets, `tripod data prepare` and the data CLI.
tpd_add_gtest(test_data LABEL unit TIMEOUT 60
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data.cc
  LIBS tpd_engine)
