#!/usr/bin/env bash
# GPT-2 BPE end to end through the binary: `tripod data prepare` with vocab.json and
# merges.txt, `tripod train` on the ids, `tripod generate` with the same files; the text
# comes back as text. Exported to Hugging Face safetensors and imported back, the model
# evaluates to the same loss and generates the same text. A missing merge file is an error
# that names the rule.
#
# usage: bpe_flow.sh TRIPOD BPE_DIR
set -euo pipefail
tripod=$1
bpe=$2
# shellcheck source=tests/engine/cli/flow_lib.sh
. "$(dirname "$0")/flow_lib.sh"
flow_begin bpe_flow

for i in $(seq 1 300); do printf 'The quick brown fox %d jumps over the lazy dog.\n\n' "$i"; done >"$work/text.txt"
out=$("$tripod" data prepare --input "$work/text.txt" --output "$work/corpus" --records blank \
  --vocab-file "$bpe/vocab.json" --merge-file "$bpe/merges.txt")
echo "$out"
[[ $out == *"300 documents"*"GPT-2 BPE, vocab 800"* ]] || fail "prepare: $out"

cat >"$work/tiny.yaml" <<YAML
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, vocab_size: 800, seq_length: 16,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 60, num_threads: 1}
optimizer: {lr: 1.0e-2, lr_warmup_iters: 2}
data: {data_path: $work/corpus}
logging: {log_interval: 20, metrics_file: "", eval_interval: 0}
checkpoint: {save: $work/ck}
YAML
"$tripod" train "$work/tiny.yaml" >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "train"; }
first=$(grep -o 'lm loss: [0-9.E+-]*' "$work/train.log" | head -1 | cut -d' ' -f3)
last=$(grep -o 'lm loss: [0-9.E+-]*' "$work/train.log" | tail -1 | cut -d' ' -f3)
echo "bpe_flow: loss $first -> $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1.0) }' || fail "loss did not fall: $first -> $last"

text=$("$tripod" generate "$work/ck" --prompt "The quick" --max-new-tokens 12 --temperature 0 \
  --vocab-file "$bpe/vocab.json" --merge-file "$bpe/merges.txt")
echo "bpe_flow: generated: $text"
[[ $text == "The quick"* ]] || fail "generate output does not start with the prompt"
[[ $text == *"brown"* || $text == *"fox"* ]] || fail "greedy text after 'The quick' has neither 'brown' nor 'fox'"

# the Hugging Face round trip a GPT-2 user takes: export, import as a weights-only
# checkpoint, then evaluate and generate from it with the same tokenizer files
"$tripod" export "$work/ck" --format hf --output "$work/hf" >/dev/null
"$tripod" import "$work/hf" --format hf --output "$work/imported" >/dev/null
loss_ck=$("$tripod" eval "$work/tiny.yaml" checkpoint.load="$work/ck" --iters 2 | grep -o 'lm loss: [0-9.E+-]*')
loss_hf=$("$tripod" eval "$work/tiny.yaml" checkpoint.load="$work/imported" --iters 2 | grep -o 'lm loss: [0-9.E+-]*')
echo "bpe_flow: eval of the checkpoint $loss_ck, of its Hugging Face round trip $loss_hf"
[[ -n $loss_ck && $loss_ck == "$loss_hf" ]] || fail "eval after export/import: $loss_hf, before: $loss_ck"
text_hf=$("$tripod" generate "$work/imported" --prompt "The quick" --max-new-tokens 12   --temperature 0 --vocab-file "$bpe/vocab.json" --merge-file "$bpe/merges.txt")
[[ $text_hf == "$text" ]] || fail "generate after export/import: '$text_hf', before: '$text'"

set +e
err=$("$tripod" generate "$work/ck" --vocab-file "$bpe/vocab.json" 2>&1)
rc=$?
set -e
[[ $rc -eq 2 && $err == *"--vocab-file and --merge-file go together"* ]] || fail "rc $rc: $err"
echo "bpe_flow: OK"
