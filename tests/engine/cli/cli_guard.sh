#!/usr/bin/env bash
# Bad input at the command line and in data files, each refused with a message naming the
# thing and the rule:
#  1. numeric options parsed strictly (whole string, range, finite), the option named;
#  2. `generate` streams its text: after a SIGTERM the output file holds what was made;
#  3. JSON Lines text with a NUL (\u0000) is refused with its line, never cut short;
#  4. `data prepare` never writes over a data set without --force, and a failed commit
#     leaves the old pair, not a new .bin beside an old .idx;
#  5. messages: a directory as a config or a profile, an .idx whose dtype code changed,
#     checkpoint.load given a file, a huge YAML file, --help and --version.
# usage: cli_guard.sh TRIPOD_BIN SOURCE_DIR
set -u
bin=$1
src=$2
. "$(dirname "$0")/flow_lib.sh"
flow_begin cli_guard
flow_corpus "$bin" 200
cd "$work" || exit 1
# every check runs (a failure is counted, not fatal), so one run shows each that fails
nbad=0
O=(data.data_path="$work/corpus" model.num_layers=2 model.hidden_size=32 model.num_attention_heads=4
   model.seq_length=16 training.micro_batch_size=2 training.global_batch_size=4
   logging.metrics_file= logging.eval_interval=0 training.num_threads=1)

refused() { # MESSAGE COMMAND...: exits 2 (1 for data prepare) and says MESSAGE
  local msg=$1
  shift
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -eq 0 ] || ! grep -qF -- "$msg" <<<"$out"; then
    bad "'$*' -> exit $rc, expected an error saying '$msg': $(head -3 <<<"$out")"
  fi
}

"$bin" train "$src/configs/demo.yaml" "${O[@]}" training.train_iters=2 checkpoint.save=ck \
  >train.log 2>&1 || fail "training the checkpoint: $(tail -3 train.log)"

# (5.) checkpoint.load given a file, while the data set is intact
refused "checkpoint ck/latest: is a file; a checkpoint is a directory" "$bin" train "$src/configs/demo.yaml" \
  "${O[@]}" training.train_iters=1 checkpoint.load=ck/latest

# 1. numbers
refused "--steps 'abc' must be an integer" "$bin" bench "$src/configs/demo.yaml" "${O[@]}" --steps abc
refused "--steps '0' must be an integer from 1" "$bin" bench "$src/configs/demo.yaml" "${O[@]}" --steps 0
refused "--steps '-3' must be" "$bin" bench "$src/configs/demo.yaml" "${O[@]}" --steps -3
refused "--iters 'abc' must be an integer" "$bin" eval "$src/configs/demo.yaml" "${O[@]}" \
  checkpoint.load=ck --iters abc
refused "--max-new-tokens 'abc' must be an integer" "$bin" generate ck --max-new-tokens abc
refused "--max-new-tokens '3x' must be an integer" "$bin" generate ck --max-new-tokens 3x
refused "--max-new-tokens '-1' must be an integer from 0" "$bin" generate ck --max-new-tokens -1
refused "--temperature 'nan' must be a finite number" "$bin" generate ck --temperature nan
refused "--top-p '0.5abc' must be a finite number" "$bin" generate ck --top-p 0.5abc
refused "--top-k ' 3' must be an integer" "$bin" generate ck --top-k " 3"
refused "--seed 'abc' must be an integer" "$bin" generate ck --seed abc
refused "--device 'gpu': expected cpu or cuda" "$bin" generate ck --device gpu
refused "--layout '1,1,1x' must be a comma-separated list of 3 integers" "$bin" import ck --format hf --output imp --layout 1,1,1x
refused "--gpus '2147483647' must be an integer from 1 to" "$bin" plan "$src/configs/demo.yaml" --gpus 2147483647
out=$("$bin" generate ck --max-new-tokens 3 --seed 5 --temperature 0.5 --top-p 0.9 --top-k 5 \
  --device cpu 2>&1) || bad "generate with valid options: $out"

# 2. SIGTERM to generate writing into a file
"$bin" generate ck --max-new-tokens 16000000 >gen.txt 2>gen.err &
pid=$!
# once it has written some text (60 s at most: start-up can be slow on a loaded machine)
for _ in $(seq 1 600); do [ "$(stat -c %s gen.txt)" -gt 10 ] && break; sleep 0.1; done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -eq 4 ] || bad "generate after SIGTERM: exit $rc, expected 4: $(cat gen.err)"
[ "$(stat -c %s gen.txt)" -gt 10 ] || bad "generate after SIGTERM left $(stat -c %s gen.txt) bytes"
grep -q "stopped by a signal after" gen.err || bad "generate did not say it stopped: $(cat gen.err)"
# a closed pipe: generate ends (no hang, no crash) with an error
timeout 120 "$bin" generate ck --max-new-tokens 16000000 2>pipe.err | head -c 10 >/dev/null
rc=${PIPESTATUS[0]}
[ $rc -eq 1 ] || bad "generate into a closed pipe: exit $rc, expected 1: $(cat pipe.err)"

# 3. JSON Lines with a NUL
printf '{"text": "fine"}\n{"text": "a\\u0000b"}\n' >nul.jsonl
refused "nul.jsonl:2: the line holds a NUL character" "$bin" data prepare --input nul.jsonl \
  --output nul --records jsonl
[ -e nul.bin ] && bad "a data set was written from nul.jsonl"
printf '{"text": "a\\\\u0000b"}\n' >escaped.jsonl # an escaped backslash: the text \u0000
"$bin" data prepare --input escaped.jsonl --output escaped --records jsonl >/dev/null 2>&1 \
  || bad "the literal text \\u0000 was refused"
refused "--records takes file, blank, percent or jsonl" "$bin" data prepare --input nul.jsonl \
  --output x --records json

# 4. data prepare over a data set
cp corpus.bin old.bin
refused "corpus.idx exists; --force replaces the data set" "$bin" data prepare --input text.txt \
  --output corpus --records blank
cmp -s corpus.bin old.bin || bad "the refused prepare changed corpus.bin"
refused "corpus.idx exists" "$bin" data prepare --input corpus.bin --output corpus
printf 'other text\n\n' >other.txt
mv corpus.idx corpus.idx.keep && mkdir corpus.idx && touch corpus.idx/x # an .idx that cannot be replaced
"$bin" data prepare --input other.txt --output corpus --force >force.log 2>&1 && bad "prepare over an unreplaceable .idx succeeded"
cmp -s corpus.bin old.bin || bad "a failed prepare left a new corpus.bin beside the old .idx"
rm -rf corpus.idx && mv corpus.idx.keep corpus.idx
"$bin" data prepare --input other.txt --output corpus --force >/dev/null 2>&1 || bad "prepare --force"
cmp -s corpus.bin old.bin && bad "prepare --force did not replace corpus.bin"

# 5. messages
refused "/tmp: is a directory, not a YAML file" "$bin" config show /tmp
refused "cluster profile /tmp: is a directory" "$bin" plan "$src/configs/demo.yaml" --cluster /tmp
{ echo "parallel:"; printf '  pipeline_layers: ['; for _ in $(seq 1 40000); do printf '1, 1, 1, 1, 1, 1, 1, 1, 1, 1, '; done; echo '1]'; } >huge.yaml
refused "huge.yaml: is $(stat -c %s huge.yaml) bytes, more than the 1048576" "$bin" config show huge.yaml
"$bin" data prepare --input text.txt --output d16 --records blank >/dev/null 2>&1
printf '\x04' | dd of=d16.idx bs=1 seek=17 conv=notrunc 2>/dev/null
refused "d16.idx: the dtype code at byte offset 17 says int32 (code 4, 4 bytes a token), but the sequence pointers are those of 2-byte tokens" \
  "$bin" data info d16
# data random: N uniform tokens over the vocabulary, the same bytes for the same seed,
# other bytes for another, never over a data set without --force
"$bin" data random --output r1 --vocab-size 50257 --tokens 20000 --doc-length 1000 >/dev/null ||
  bad "data random failed"
"$bin" data random --output r2 --vocab-size 50257 --tokens 20000 --doc-length 1000 >/dev/null
"$bin" data random --output r3 --vocab-size 50257 --tokens 20000 --doc-length 1000 --seed 9 >/dev/null
info=$("$bin" data info r1 --vocab-size 50257)
echo "$info" | grep -q "tokens: *20000$" || bad "data random: token count: $info"
echo "$info" | grep -q "documents: *20$" || bad "data random: documents: $info"
max=$(echo "$info" | sed -n 's/^max token: *//p')
[ "${max:-0}" -gt 50000 ] || bad "data random: max token $max, not spread over the vocabulary"
cmp -s r1.bin r2.bin || bad "data random: the same seed wrote other tokens"
cmp -s r1.bin r3.bin && bad "data random: another seed wrote the same tokens"
refused "data random: r1.idx exists; --force replaces the data set" \
  "$bin" data random --output r1 --vocab-size 50257 --tokens 10
refused "--vocab-size '0' must be an integer from 1 to" \
  "$bin" data random --output r4 --vocab-size 0 --tokens 10
for cmd in train bench eval; do
  "$bin" $cmd --help 2>&1 | grep -q "usage: .*tripod $cmd" || bad "$cmd --help does not print its own usage"
done
"$bin" config show --help 2>&1 | grep -q "usage: tripod config show" || bad "config show --help"
"$bin" --version | grep -qE "^tripod [0-9]+\.[0-9]+" || bad "--version: $("$bin" --version 2>&1 | head -1)"

[ $nbad -eq 0 ] || fail "$nbad checks failed"
echo "cli_guard: PASS"
