#!/usr/bin/env bash
# A FIFO where a file is read (a config, a cluster profile, a data set's .idx and .bin, a
# tokenizer.json, a Hugging Face config.json and safetensors shard, an llm.c model file,
# a metrics file) is refused at once, naming the file: opening one for reading would wait
# for a writer forever. Each command runs under `timeout`, so a hang fails (exit 124).
# usage: fifo_guard.sh TRIPOD_BIN SOURCE_DIR
set -u
bin=$1
src=$2
. "$(dirname "$0")/flow_lib.sh"
flow_begin fifo_guard
flow_corpus "$bin" 20
cd "$work" || exit 1
nbad=0

refused() { # FIFO COMMAND...: fails within 20 s, naming FIFO and saying it is a FIFO
  local fifo=$1
  shift
  local out rc
  out=$(timeout 20 "$@" 2>&1 </dev/null)
  rc=$?
  if [ $rc -eq 124 ]; then
    bad "'$*' hung on the FIFO $fifo"
  elif [ $rc -eq 0 ] || ! grep -qF -- "$fifo" <<<"$out" || ! grep -qF -- "a FIFO" <<<"$out"; then
    bad "'$*' -> exit $rc, expected an error naming $fifo as a FIFO: $(head -3 <<<"$out")"
  fi
}

mkfifo cfg.yaml profile.yaml metrics.jsonl tok.json model.bin
refused cfg.yaml "$bin" config show cfg.yaml
refused cfg.yaml "$bin" plan cfg.yaml
refused profile.yaml "$bin" plan "$src/configs/demo.yaml" --cluster ./profile.yaml
refused metrics.jsonl "$bin" report metrics.jsonl --out rep
refused model.bin "$bin" import model.bin --format llmc --output imported
refused tok.json "$bin" data prepare --input text.txt --output tk --tokenizer-type \
  HuggingFaceTokenizer --tokenizer-model tok.json

# a data set whose .idx, then whose .bin, is a FIFO
mkdir idx bin
cp corpus.bin idx/c.bin && mkfifo idx/c.idx
cp corpus.idx bin/c.idx && mkfifo bin/c.bin
refused idx/c.idx "$bin" data info idx/c
refused bin/c.bin "$bin" data info bin/c

# a Hugging Face directory whose config.json, then whose shard, is a FIFO
hf=$src/tests/engine/checkpoint/hf/gpt2/model
mkdir hfc hfs
cp "$hf/model.safetensors" hfc/ && mkfifo hfc/config.json
cp "$hf/config.json" hfs/ && mkfifo hfs/model.safetensors
refused hfc/config.json "$bin" import hfc --format hf --output imp1
refused hfs/model.safetensors "$bin" import hfs --format hf --output imp2

[ $nbad -eq 0 ] || fail "$nbad check(s) failed"
echo "fifo_guard: ok"
