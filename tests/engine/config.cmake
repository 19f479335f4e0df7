# Configuration: defaults, shipped configs, overrides, print round trip, the exact message
# of every file in bad_configs/, and `tripod config show` exiting 2 on each of them.
tpd_add_gtest(test_config LABEL unit
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_config.cc
  LIBS tpd_engine)
target_compile_definitions(test_config PRIVATE
  TPD_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  TPD_TRIPOD_BIN="$<TARGET_FILE:tripod>")
# The command-line test runs the binary, so build it first.
add_dependencies(test_config tripod)
