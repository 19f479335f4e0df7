#!/usr/bin/env bash
# The README's fine-tuning sequence on the tiny Llama fixture of tests/engine/checkpoint/hf
# (a LlamaForCausalLM folder with its tokenizer.json): import at TP2 x PP2, prepare JSON
# Lines with the folder's tokenizer (Megatron's option names), fine-tune under mpirun at
# that layout, evaluate, generate through the tokenizer, export back to a Hugging Face
# folder, and import the export again: its loss is the fine-tuned model's, bit for bit.
#
# usage: hf_finetune_flow.sh TRIPOD MPIEXEC HF_MODEL_DIR
set -euo pipefail
tripod=$1
mpiexec=$2
hf=$3
# shellcheck source=tests/engine/cli/flow_lib.sh
. "$(dirname "$0")/flow_lib.sh"
flow_begin hf_finetune_flow
mpi=("$mpiexec" --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1)

# 1. import: the printed model section becomes the training config's
"$tripod" import "$hf" --format hf --output "$work/imported" --layout 2,2,1 >"$work/import.log" ||
  fail "import: $(cat "$work/import.log")"
sed -n '/^model:$/,$p' "$work/import.log" | sed 's/^  seq_length:.*//' >"$work/ft.yaml"
grep -q "num_query_groups: 2" "$work/ft.yaml" || fail "model section: $(cat "$work/ft.yaml")"
cat >>"$work/ft.yaml" <<YAML
  seq_length: 32
  make_vocab_size_divisible_by: 8
parallel:
  tensor_model_parallel_size: 2
  pipeline_model_parallel_size: 2
training:
  micro_batch_size: 2
  global_batch_size: 8
  train_iters: 8
  num_threads: 1
optimizer:
  lr: 1.0e-3
  min_lr: 1.0e-4
  lr_warmup_iters: 2
data:
  data_path: $work/ft
  split: 90,5,5
logging:
  log_interval: 1
  eval_interval: 0
  metrics_file: ""
checkpoint:
  load: $work/imported
  finetune: true
  save: $work/ft_ck
YAML

# 2. data: JSON Lines through the model's tokenizer.json, BOS + text + EOD per document
for i in $(seq 1 300); do
  printf '{"text": "The quick brown fox %d jumps over the lazy dog; it'"'"'s a model."}\n' "$i"
done >"$work/ft.jsonl"
"$tripod" data prepare --input "$work/ft.jsonl" --records jsonl --output "$work/ft" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$hf/tokenizer.json" --append-eod \
  >"$work/prep.log" || fail "prepare: $(cat "$work/prep.log")"

# 3. fine-tune at TP2 x PP2: the loss falls
"${mpi[@]}" -np 4 "$tripod" train "$work/ft.yaml" >"$work/train.log" 2>&1 ||
  fail "train: $(tail -5 "$work/train.log")"
first=$(grep -o 'lm loss: [0-9.E+-]*' "$work/train.log" | head -1 | cut -d' ' -f3)
last=$(grep -o 'lm loss: [0-9.E+-]*' "$work/train.log" | tail -1 | cut -d' ' -f3)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "loss $first -> $last"

# 4. evaluate the fine-tuned checkpoint on one rank (any layout loads it)
E=(parallel.tensor_model_parallel_size=1 parallel.pipeline_model_parallel_size=1
   checkpoint.finetune=false --iters 2)
ev_ft=$("$tripod" eval "$work/ft.yaml" checkpoint.load="$work/ft_ck" "${E[@]}" |
  grep -o 'lm loss: [0-9.E+-]*') || fail "eval of the fine-tuned model"

# 5. generate through the same tokenizer
gen=$("$tripod" generate "$work/ft_ck" --tokenizer-type HuggingFaceTokenizer \
  --tokenizer-model "$hf/tokenizer.json" --prompt "The quick" --max-new-tokens 8 \
  --temperature 0) || fail "generate"
[[ $gen == "The quick"* && ${#gen} -gt 9 ]] || fail "generate printed '$gen'"

# 6. export back to Hugging Face, import the export: the same model
"$tripod" export "$work/ft_ck" --format hf --output "$work/hf_out" >/dev/null || fail "export"
[[ -f $work/hf_out/config.json ]] || fail "no config.json in the export"
grep -q '"LlamaForCausalLM"' "$work/hf_out/config.json" || fail "export architecture"
"$tripod" import "$work/hf_out" --format hf --output "$work/back" >/dev/null || fail "re-import"
ev_back=$("$tripod" eval "$work/ft.yaml" checkpoint.load="$work/back" "${E[@]}" |
  grep -o 'lm loss: [0-9.E+-]*') || fail "eval of the re-imported model"
[[ $ev_back == "$ev_ft" ]] || fail "re-imported $ev_back, fine-tuned $ev_ft"
echo "hf_finetune_flow: loss $first -> $last; eval $ev_ft; generate '$gen'; PASS"
