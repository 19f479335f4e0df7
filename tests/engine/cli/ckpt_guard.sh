#!/usr/bin/env bash
# What a run, an import and an export may write over, and what a checkpoint's manifest
# may claim:
#  1. `latest` deleted: load=auto resumes the newest checkpoint (it never starts fresh over
#     it), with and without fallback=previous;
#  2. a run that loaded nothing, or weights only, refuses a save directory holding another
#     run's checkpoints (checkpoint.overwrite=true allows it); nothing there changes;
#  3. import refuses a destination holding a checkpoint (--force: beside it);
#  4. export refuses an output inside the checkpoint, and an existing file without --force;
#  5. a stale iter_N.tmp of a failed save is removed when the next run starts;
#  6. manifest fields edited and re-hashed (file_offset, TP, iteration, a run outside its
#     tensor) are refused by inspect and by a load;
#  7. a second run on a save directory while another runs there is refused at start-up,
#     naming the holder's pid; the first one goes on and saves.
# usage: ckpt_guard.sh TRIPOD_BIN SOURCE_DIR
set -u
bin=$1
src=$2
. "$(dirname "$0")/flow_lib.sh"
flow_begin ckpt_guard
flow_corpus "$bin" 200
cd "$work" || exit 1
# every check runs (a failure is counted, not fatal), so one run shows each that fails
flow_tiny_run "$bin" "$src"
# sha256 of every manifest under a directory: what "nothing there changed" compares
fingerprint() { find "$1" -name manifest.json | sort | xargs sha256sum; cat "$1/latest" 2>/dev/null; }

train training.train_iters=4 checkpoint.save=ck >train1.log 2>&1 || fail "first run: $(tail -3 train1.log)"
[ -d ck/iter_0000004 ] && [ -d ck/iter_0000002 ] || bad "first run saved $(ls ck)"

# 1. latest deleted
rm ck/latest
train training.train_iters=6 checkpoint.save=ck checkpoint.load=auto training.seed=99 \
  >auto.log 2>&1 || bad "load=auto without latest: exit $?: $(tail -3 auto.log)"
grep -q "loaded checkpoint ck/iter_0000004" auto.log || bad "load=auto without latest did not resume iter_0000004: $(head -5 auto.log)"
grep -q "starting fresh" auto.log && bad "load=auto without latest started fresh"
# without fallback=previous only the newest is tried: the message must not promise more
grep -q "that verifies, from" auto.log && bad "load=auto without latest and fallback promised a fallback: $(grep missing auto.log)"
grep -q "ck/latest is missing; resuming from the newest checkpoint there, ck/iter_0000004 (checkpoint.fallback: previous" auto.log \
  || bad "latest-missing message without fallback: $(grep missing auto.log)"
[ "$(cat ck/latest)" = iter_0000006 ] || bad "latest is '$(cat ck/latest)' after the resumed run"
rm ck/latest
train training.train_iters=8 checkpoint.save=ck checkpoint.load=auto checkpoint.fallback=previous \
  >fb.log 2>&1 || bad "fallback=previous without latest: exit $?: $(tail -3 fb.log)"
grep -q "loaded checkpoint ck/iter_0000006" fb.log || bad "fallback=previous without latest did not resume iter_0000006"
grep -q "ck/latest is missing; resuming from the newest checkpoint there that verifies, from ck/iter_0000006 down" fb.log \
  || bad "latest-missing message with fallback: $(grep missing fb.log)"

# 2. a run that did not load from this directory
before=$(fingerprint ck)
train training.train_iters=2 checkpoint.save=ck training.seed=99 >fresh.log 2>&1
rc=$?
[ $rc -eq 2 ] || bad "a fresh run into a save directory of another run: exit $rc (expected 2): $(tail -3 fresh.log)"
grep -q "checkpoint.save: ck holds .* checkpoints of another run (newest iter_0000008)" fresh.log \
  || bad "refusal message: $(tail -2 fresh.log)"
grep -q "iteration " fresh.log && bad "the refused run trained"
[ "$(fingerprint ck)" = "$before" ] || bad "the refused run changed ck"
train training.train_iters=2 checkpoint.save=ck checkpoint.load=ck/iter_0000006 \
  checkpoint.finetune=true >ft.log 2>&1
[ $? -eq 2 ] || bad "fine-tune into a save directory holding other checkpoints was not refused"
[ "$(fingerprint ck)" = "$before" ] || bad "the refused fine-tune changed ck"
train training.train_iters=2 checkpoint.save=ck2 >ck2.log 2>&1 || bad "run into ck2"
train training.train_iters=2 checkpoint.save=ck2 checkpoint.overwrite=true >ow.log 2>&1 \
  || bad "checkpoint.overwrite=true did not allow the save: $(tail -2 ow.log)"

# 3. import onto a save directory
"$bin" export ck --format hf --output hf >/dev/null 2>&1 || bad "export hf"
"$bin" import hf --format hf --output ck >imp.log 2>&1
[ $? -eq 2 ] || bad "import onto a save directory: exit $? (expected 2)"
grep -q "holds a checkpoint" imp.log || bad "import message: $(cat imp.log)"
[ "$(fingerprint ck)" = "$before" ] || bad "the refused import changed ck"
"$bin" import hf --format hf --output fresh_import >/dev/null 2>&1 || bad "import into a new directory"
train training.train_iters=2 checkpoint.save=fresh_import checkpoint.load=auto >fi.log 2>&1 \
  || bad "training from an import in its own directory: $(tail -2 fi.log)"

# 4. export
"$bin" export ck --format llmc --output ck/latest >exp.log 2>&1
[ $? -eq 2 ] || bad "export into the checkpoint: exit $? (expected 2)"
grep -q "is inside ck" exp.log || bad "export message: $(cat exp.log)"
"$bin" export ck --format llmc --output ck/iter_0000008/model.bin >/dev/null 2>&1 \
  && bad "export into the checkpoint directory was allowed"
"$bin" inspect ck >/dev/null 2>&1 || bad "the checkpoint no longer verifies after the refused exports"
echo keep >model.bin
"$bin" export ck --format llmc --output model.bin >exp2.log 2>&1
[ $? -eq 2 ] || bad "export over an existing file without --force"
[ "$(cat model.bin)" = keep ] || bad "the refused export changed model.bin"
"$bin" export ck --format llmc --output model.bin --force >/dev/null 2>&1 || bad "export --force"
[ "$(stat -c %s model.bin)" -gt 1000 ] || bad "export --force did not replace model.bin"
[ -e model.bin.tmp ] && bad "export left model.bin.tmp"
"$bin" export ck --format hf --output hf >/dev/null 2>&1 && bad "export over hf/ without --force"

# 5. a stale tmp of a failed save
mkdir -p ck2/iter_0000010.tmp && echo partial >ck2/iter_0000010.tmp/model_tp00_pp00.bin
train training.train_iters=4 checkpoint.save=ck2 checkpoint.load=auto >tmp.log 2>&1 || bad "run after a failed save: $(tail -2 tmp.log)"
[ -e ck2/iter_0000010.tmp ] && bad "the stale ck2/iter_0000010.tmp was not removed"
grep -q "removed ck2/iter_0000010.tmp" tmp.log || bad "the removal was not said"

# 6. manifest fields, edited and re-hashed
edit() { # NAME SED-EXPRESSION: a copy of ck/iter_0000008 with the manifest edited
  rm -rf "$1" && cp -r ck/iter_0000008 "$1"
  sed -i "$2" "$1/manifest.json"
  cmp -s "$1/manifest.json" ck/iter_0000008/manifest.json && bad "$1: the edit '$2' changed nothing"
  sha256sum "$1/manifest.json" | cut -c1-64 | tr -d '\n' >"$1/manifest.sha256"
}
refused() { # NAME MESSAGE
  "$bin" inspect "$1" >"$1.log" 2>&1 && bad "$1: inspect accepted the edited manifest"
  grep -q -- "$2" "$1.log" || bad "$1: message: $(cat "$1.log")"
  train training.train_iters=10 checkpoint.save= checkpoint.load="$1" >"$1.train.log" 2>&1 \
    && bad "$1: a run loaded the edited manifest"
  return 0
}
edit foff '0,/"file_offset":\t0/s//"file_offset":\t4/'
refused foff "file_offset"
edit foff3 '0,/"file_offset":\t0/s//"file_offset":\t3/'
refused foff3 "file_offset 3 is not a whole number"
edit tp0 's/"tensor_model_parallel_size":\t1/"tensor_model_parallel_size":\t0/'
refused tp0 "'tensor_model_parallel_size' is 0, outside"
edit iterneg '0,/"iteration":\t8/s//"iteration":\t-7/'
refused iterneg "'iteration' is -7, outside"
edit goff '0,/"global_offset":\t0/s//"global_offset":\t32/'
refused goff "lies outside its"

# 7. two runs at once on one save directory
"$bin" train "$src/configs/demo.yaml" "${common[@]}" training.train_iters=100000 \
  checkpoint.save=ck7 >hold.log 2>&1 &
holder=$!
for _ in $(seq 1 120); do
  grep -q '^ iteration' hold.log && break
  kill -0 $holder 2>/dev/null || break
  sleep 0.5
done
grep -q '^ iteration' hold.log || bad "the first run on ck7 never trained: $(tail -3 hold.log)"
train training.train_iters=2 checkpoint.save=ck7 checkpoint.load=auto >second.log 2>&1
rc=$?
[ $rc -eq 2 ] || bad "a second run on ck7: exit $rc (expected 2): $(tail -3 second.log)"
grep -q "checkpoint.save: ck7 is in use by another run (pid $holder on host " second.log \
  || bad "second-run refusal: $(tail -2 second.log)"
grep -q "^ iteration" second.log && bad "the refused second run trained"
kill -TERM $holder
wait $holder || bad "the first run on ck7 exited $? after SIGTERM"
[ -f ck7/latest ] || bad "the first run on ck7 did not save after the refused one: $(ls -a ck7)"

[ $nbad -eq 0 ] || fail "$nbad checks failed"
echo "ckpt_guard: PASS"
