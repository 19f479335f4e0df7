#!/usr/bin/env bash
# A Hugging Face tokenizer.json through the binary, with Megatron's option names:
# `tripod data prepare --tokenizer-type HuggingFaceTokenizer --tokenizer-model
# tokenizer.json --append-eod` on JSON Lines writes, per document, the ids `tokenizers`
# gives its text with the BOS (the fixture's golden set) and then the end-of-document
# token; without --append-eod no EOD. GPT2BPETokenizer still takes GPT-2's files. A
# SentencePiece tokenizer.model, and --append-eod with a tokenizer that has no
# end-of-document token, are refused with messages that say so. A tiny model trained on
# those ids generates text through `tripod generate` with the same options.
#
# usage: hf_tokenizer_flow.sh TRIPOD HF_TOKENIZER_DIR BPE_DIR
set -euo pipefail
tripod=$1
dir=$2
bpe=$3
# shellcheck source=tests/engine/cli/flow_lib.sh
. "$(dirname "$0")/flow_lib.sh"
flow_begin hf_tokenizer_flow
tok=$dir/llama3/tokenizer.json

# golden lines 1, 9, 10, 13: English, Cyrillic, Japanese, emoji (nothing JSON escapes)
: >"$work/docs.jsonl"
want=() want_no_eod=()
for n in 1 9 10 13; do
  line=$(sed -n "${n}p" "$dir/llama3/golden.jsonl")
  hex=$(sed 's/.*"hex":"\([0-9a-f]*\)".*/\1/' <<<"$line")
  # shellcheck disable=SC2059 # the format is the text's bytes as \xHH escapes
  printf '{"text": "%s"}\n' "$(printf "$(sed 's/../\\x&/g' <<<"$hex")")" >>"$work/docs.jsonl"
  ids=$(sed 's/.*"ids_special":\[\([0-9,]*\)\].*/\1/' <<<"$line")
  want+=(${ids//,/ } EOD)
  want_no_eod+=(${ids//,/ })
done

out=$("$tripod" data prepare --input "$work/docs.jsonl" --output "$work/eod" --records jsonl \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" --append-eod)
echo "$out"
[[ $out == *"4 documents"*"tokenizer.json, vocab 403, each ended by EOD <|end_of_text|> (id "* ]] ||
  fail "prepare: $out"
eod=$(sed 's/.*(id \([0-9]*\)).*/\1/' <<<"$out")
grep -q "\"id\":$eod,\"content\":\"<|end_of_text|>\"" "$tok" || fail "EOD id $eod is not <|end_of_text|>'s"
got=$(od -An -tu2 -v "$work/eod.bin" | xargs)
expect=$(sed "s/EOD/$eod/g" <<<"${want[*]}")
[[ $got == "$expect" ]] || fail "ids with --append-eod: got '$got', want '$expect'"
"$tripod" data info "$work/eod" --vocab-size 403 >/dev/null || fail "data info"

# the model folder serves too; without --append-eod, the documents do not end with EOD
out=$("$tripod" data prepare --input "$work/docs.jsonl" --output "$work/plain" --records jsonl \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$dir/llama3")
got=$(od -An -tu2 -v "$work/plain.bin" | xargs)
[[ $got == "${want_no_eod[*]}" ]] || fail "ids without --append-eod: got '$got', want '${want_no_eod[*]}'"
echo "hf_tokenizer_flow: ${#want[@]} ids as tokenizers gives them"

# Megatron's name for GPT-2's files
out=$("$tripod" data prepare --input "$work/docs.jsonl" --output "$work/gpt2" --records jsonl \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$bpe/vocab.json" --merge-file "$bpe/merges.txt")
[[ $out == *"4 documents"*"GPT-2 BPE, vocab 800"* ]] || fail "GPT2BPETokenizer: $out"

expect_error() { # expect_error WANT ARGS...: exit status 2 and WANT in the error
  local want=$1 err rc
  shift
  set +e
  err=$("$tripod" data prepare --input "$work/docs.jsonl" --output "$work/x" --records jsonl "$@" 2>&1)
  rc=$?
  set -e
  [[ $rc -eq 2 && $err == *"$want"* ]] || fail "rc $rc for '$*': $err"
}
printf '\x0a\x0b\x0a\x05<unk>\x15\x00\x00\x00\x00' >"$work/tokenizer.model"
expect_error "SentencePiece is not supported" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$work/tokenizer.model"
expect_error "SentencePiece is not supported" \
  --tokenizer-type SentencePieceTokenizer --tokenizer-model "$work/tokenizer.model"
expect_error "--tokenizer-type HuggingFaceTokenizer takes --tokenizer-model" \
  --tokenizer-type HuggingFaceTokenizer
mkdir "$work/noeod"
sed 's/<|end_of_text|>/<|eot|>/g' "$tok" >"$work/noeod/tokenizer.json"
expect_error "has no end-of-document token" \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$work/noeod/tokenizer.json" --append-eod

# `tripod generate` with the same tokenizer.json: train a tiny model on its ids, then the
# greedy text after a prompt (encoded with its BOS) comes back as text
for i in $(seq 1 300); do printf '{"text": "The quick brown fox %d jumps over the lazy dog."}\n' "$i"; done >"$work/fox.jsonl"
"$tripod" data prepare --input "$work/fox.jsonl" --output "$work/fox" --records jsonl \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok" --append-eod >/dev/null
cat >"$work/tiny.yaml" <<YAML
model: {num_layers: 2, hidden_size: 32, num_attention_heads: 2, vocab_size: 403, seq_length: 16,
        make_vocab_size_divisible_by: 8}
training: {micro_batch_size: 2, global_batch_size: 8, train_iters: 60, num_threads: 1}
optimizer: {lr: 1.0e-2, lr_warmup_iters: 2}
data: {data_path: $work/fox}
logging: {log_interval: 20, metrics_file: "", eval_interval: 0}
checkpoint: {save: $work/ck}
YAML
"$tripod" train "$work/tiny.yaml" >"$work/train.log" 2>&1 || { cat "$work/train.log"; fail "train"; }
text=$("$tripod" generate "$work/ck" --prompt "The quick" --max-new-tokens 12 --temperature 0 \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tok")
echo "hf_tokenizer_flow: generated: $text"
[[ $text == "The quick"* ]] || fail "generate output does not start with the prompt"
[[ $text == *"brown"* || $text == *"fox"* ]] || fail "greedy text after 'The quick' has neither 'brown' nor 'fox'"
echo "hf_tokenizer_flow: OK"
