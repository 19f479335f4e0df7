# The planner's sources, relative to engine/ (included by engine/CMakeLists.txt).
set(TPD_PLAN_SOURCES
  plan/cluster.c
  plan/cluster_save.c
  plan/model.c
  plan/balance.c
  plan/timing.c
  plan/timing_cpu.c
  plan/evaluate.c
  plan/search.c
  plan/report.c
  plan/timeline.c
  plan/trace.c
  plan/cli.c
)
# `--cluster NAME` also looks in the source tree's configs/clusters/.
set_source_files_properties(plan/cluster.c PROPERTIES
  COMPILE_DEFINITIONS "TPD_SOURCE_DIR=\"${PROJECT_SOURCE_DIR}\"")
