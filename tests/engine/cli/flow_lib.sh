# Sourced by the command-line flow tests: a scratch directory removed on exit, a failure
# helper naming the test, and the small blank-line separated corpus they train on.
#
# usage: flow_begin NAME   (sets $work)
#        flow_corpus TRIPOD [N] (writes $work/text.txt with N records, default 400, and
#                                prepares it byte-level as $work/corpus)
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
