# Sourced by the command-line flow tests: a scratch directory removed on exit, a failure
# helper naming the test, and the small blank-line separated corpus they train on.
#
# usage: flow_begin NAME   (sets $work)
#        flow_corpus TRIPOD [N] (writes $work/text.txt with N records, default 400, and
#                                prepares it byte-level as $work/corpus)
#        flow_tiny_run TRIPOD SOURCE_DIR (a guard script's two-layer model on that corpus:
#                                the overrides in ${common[@]}, `train ARGS...` runs it with
#                                a save every 2 iterations, and `bad MESSAGE` counts a
#                                failed check in $nbad without stopping the script; any
#                                script may use `bad` after setting nbad=0)
flow_begin() {
  flow_name=$1
  work=$(mktemp -d "/tmp/tripod_${flow_name}.XXXXXX")
  trap 'rm -rf "$work"' EXIT
}

fail() { echo "$flow_name: FAIL: $*" >&2; exit 1; }

flow_corpus() {
  local n=${2:-400}
  for i in $(seq 1 "$n"); do
    printf 'record %d: the quick brown fox jumps over the lazy dog.\n\n' "$i"
  done >"$work/text.txt"
  "$1" data prepare --input "$work/text.txt" --output "$work/corpus" --records blank >/dev/null
}

flow_tiny_run() {
  flow_bin=$1
  flow_src=$2
  nbad=0
  common=(data.data_path="$work/corpus" model.num_layers=2 model.hidden_size=32
          model.num_attention_heads=4 model.seq_length=16 training.micro_batch_size=2
          training.global_batch_size=4 logging.metrics_file= logging.eval_interval=0
          training.num_threads=1 checkpoint.save_interval=2)
}

bad() { echo "$flow_name: FAIL: $*" >&2; nbad=$((nbad + 1)); }

train() { "$flow_bin" train "$flow_src/configs/demo.yaml" "${common[@]}" "$@"; }
