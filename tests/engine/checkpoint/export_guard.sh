#!/usr/bin/env bash
# Where an export writes, and what eval and generate do with nothing to load:
#  1. export's temporary is its own (a user's OUTPUT.tmp is left alone) and is removed when
#     the export fails;
#  2. an export never lands among a checkpoint's files: SAVE/latest and files inside a
#     checkpoint folder are refused, --force or not;
#  3. export --force over an earlier sharded export replaces it whole (no stale index or
#     shards beside the new single file), and the other way round;
#  4. eval with checkpoint.load=auto and no checkpoint in checkpoint.save, and generate on
#     a folder without a checkpoint, are refused naming the folder.
# usage: export_guard.sh TRIPOD_BIN SOURCE_DIR
set -u
bin=$1
src=$2
. "$src/tests/engine/cli/flow_lib.sh"
flow_begin export_guard
flow_corpus "$bin" 200
cd "$work" || exit 1
flow_tiny_run "$bin" "$src"
train training.train_iters=4 checkpoint.save=ck >train.log 2>&1 || fail "train: $(tail -3 train.log)"

# 1. the temporary is the export's own
echo mine >model.bin.tmp
"$bin" export ck --format llmc --output model.bin >exp1.log 2>&1 || bad "export llmc: $(cat exp1.log)"
[ "$(cat model.bin.tmp)" = mine ] || bad "export wrote over the user's model.bin.tmp"
ls -d model.bin.tmp-* >/dev/null 2>&1 && bad "export left $(ls -d model.bin.tmp-*)"
# a failed export (config.json of the output is a folder: the move into place fails)
mkdir -p hfbad/config.json/x
"$bin" export ck --format hf --output hfbad --force >bad.log 2>&1 && bad "export onto hfbad/config.json/ succeeded"
ls -d hfbad.tmp-* >/dev/null 2>&1 && bad "the failed export left $(ls -d hfbad.tmp-*)"

# 2. never among a checkpoint's files
latest=$(cat ck/latest)
"$bin" export ck/iter_0000004 --format llmc --output ck/latest --force >l.log 2>&1
rc=$?
[ $rc -eq 2 ] || bad "export --force onto ck/latest was not refused (exit $rc)"
grep -q "ck/latest is inside .*ck, which holds a checkpoint" l.log || bad "message: $(cat l.log)"
[ "$(cat ck/latest)" = "$latest" ] || bad "ck/latest changed: $(head -c 80 ck/latest)"
"$bin" export ck/iter_0000004 --format llmc --output ck/iter_0000002/manifest.json --force >m.log 2>&1 \
  && bad "export --force onto another checkpoint's manifest.json was allowed"
"$bin" export ck/iter_0000004 --format hf --output ck/iter_0000002 --force >d.log 2>&1 \
  && bad "export --force into another checkpoint folder was allowed"
"$bin" inspect ck/iter_0000002 >/dev/null 2>&1 || bad "ck/iter_0000002 no longer verifies"

# 3. --force replaces the whole export
"$bin" export ck --format hf --output hf --max-shard-size 8000 >s.log 2>&1 || bad "sharded export: $(cat s.log)"
[ -f hf/model.safetensors.index.json ] || bad "the export was not sharded: $(ls hf)"
"$bin" export ck --format hf --output hf --force >f.log 2>&1 || bad "export --force: $(cat f.log)"
[ "$(ls hf | tr '\n' ' ')" = "config.json model.safetensors " ] || bad "after --force hf/ holds: $(ls hf | tr '\n' ' ')"
"$bin" import hf --format hf --output back >/dev/null 2>&1 || bad "the replaced export does not import"
"$bin" export ck --format hf --output hf --max-shard-size 8000 --force >s2.log 2>&1 || bad "sharded --force: $(cat s2.log)"
[ -f hf/model.safetensors ] && bad "the sharded --force export kept the single model.safetensors"
"$bin" import hf --format hf --output back2 >/dev/null 2>&1 || bad "the sharded export does not import"

# 4. nothing to load
mkdir -p empty_save
"$bin" eval "$src/configs/demo.yaml" "${common[@]}" checkpoint.save=empty_save \
  checkpoint.load=auto --iters 1 >ev.log 2>&1
rc=$?
[ $rc -eq 2 ] || bad "eval with load=auto and no checkpoint: exit $rc (expected 2): $(tail -2 ev.log)"
grep -q "no checkpoint in empty_save" ev.log || bad "eval message: $(cat ev.log)"
grep -q "lm loss" ev.log && bad "eval printed a loss of random weights"
"$bin" eval "$src/configs/demo.yaml" "${common[@]}" checkpoint.save=ck checkpoint.load=auto \
  --iters 1 >ev2.log 2>&1 || bad "eval of ck with load=auto: $(tail -2 ev2.log)"
"$bin" generate empty_save --prompt hi --max-new-tokens 2 >gen.log 2>&1 && bad "generate on an empty folder succeeded"
grep -q "empty_save" gen.log || bad "generate message: $(cat gen.log)"

[ $nbad -eq 0 ] || fail "$nbad checks failed"
echo "export_guard: PASS"
