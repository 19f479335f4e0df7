#!/usr/bin/env python3
"""Writes tests/engine/data/hf_tokenizer/missing_bytes/: a byte-level BPE tokenizer.json
whose vocabulary lacks some of the 256 byte tokens (as some released small models ship),
and the ids Hugging Face `tokenizers` gives texts that hold those bytes.

Not part of the product or of CI: run it by hand when the fixture must change. It needs
Hugging Face `tokenizers` (pip install tokenizers).

The vocabulary is every byte of GPT-2's byte alphabet but MISSING, plus a few merges,
with a GPT-2 ByteLevel pre-tokenizer and decoder and no unk_token. `tokenizers`' BPE
without byte_fallback and without unk_token drops a symbol that is not in the
vocabulary before merging, so its neighbours may then merge ("aqb" -> "ab").
Writes
  tokenizer.json  the file
  golden.jsonl    one JSON object a line: {"hex": the text's bytes in hex, "ids": the
                  ids `tokenizers` gives it, "decoded_hex": the text without the missing
                  bytes in hex (what the ids decode to; checked against `tokenizers`'
                  decode where that is valid UTF-8)}

usage: tools/hf_tokenizer_missing_bytes.py [OUT_DIR]
       (default tests/engine/data/hf_tokenizer/missing_bytes)
"""
import json
import os
import sys

from hf_tokenizer_fixture import ALPHA  # GPT-2's byte alphabet: byte -> character
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

MISSING = [0x04, 0x7F, ord("q"), 0xA9]  # 0xA9: the second byte of "é" (C3 A9)

MERGES = [("a", "b"), ("h", "e"), ("l", "l"), ("he", "ll"), ("o", "w"), ("Ġ", "t")]

TEXTS = [
    "hello\x04world",
    "\x04",
    "\x04\x04\x04",
    "aqb",
    "q",
    "qq q",
    "q\x04q",
    "abq ab",
    "plain text with no missing byte",
    "caf\u00e9 au lait",
    "del\x7fete",
    "tab\tq\n",
    "hello",
    "",
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/engine/data/hf_tokenizer/missing_bytes"
    os.makedirs(out, exist_ok=True)
    vocab = {}
    for b in range(256):
        if b not in MISSING:
            vocab[ALPHA[b]] = len(vocab)
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    path = os.path.join(out, "tokenizer.json")
    tok.save(path)
    tok = Tokenizer.from_file(path)  # what a user's program would load
    with open(os.path.join(out, "golden.jsonl"), "w") as f:
        for t in TEXTS:
            raw = t.encode("utf-8")
            ids = tok.encode(t, add_special_tokens=False).ids
            kept = bytes(c for c in raw if c not in MISSING)
            try:
                assert tok.decode(ids) == kept.decode("utf-8"), t
            except UnicodeDecodeError:
                pass  # `tokenizers` decodes to str: invalid UTF-8 becomes U+FFFD there
            f.write(json.dumps({"hex": raw.hex(), "ids": ids, "decoded_hex": kept.hex()}) + "\n")
    import tokenizers

    print("wrote", out, "with tokenizers", tokenizers.__version__)


if __name__ == "__main__":
    main()
