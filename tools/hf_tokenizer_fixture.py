#!/usr/bin/env python3
"""Writes the Hugging Face tokenizer.json fixtures of tests/engine/data/hf_tokenizer/.

Not part of the product or of CI: run it by hand when the fixtures must change.
It needs Hugging Face `tokenizers` (pip install tokenizers) and the Debian `fortunes`
files (the training text).

For each of three pre-tokenizers (Llama 3's Split regex, Qwen2's Split regex, GPT-2's
ByteLevel regex) it trains a tiny byte-level BPE (about 400 tokens) and writes
  NAME/tokenizer.json   the file as a model folder ships it
  NAME/golden.jsonl     one JSON object a line: {"hex": bytes of the text in hex,
                        "ids": ids without special tokens, "ids_special": ids with the
                        post-processor's (BOS for Llama 3), "utf8": true/false}
  llama3/pre_tokenizers.jsonl   the Llama 3 model under other pre-tokenizers (every Split
                        behavior, inverted or not, a String pattern, ByteLevel's
                        add_prefix_space): {"pre_tokenizer": ..., "cases": [{"hex", "ids"}]}
The Llama 3 one is written with merges as ["a", "b"] pairs (what `tokenizers` >= 0.20
writes), the GPT-2 and Qwen2 ones are rewritten with merges as "a b" strings (what older
versions write), so both forms are read.

Invalid UTF-8: `tokenizers` takes str, so it cannot see those bytes. Those texts are cut
into maximal valid UTF-8 runs and runs of bytes that are not valid UTF-8 (RFC 3629, as
PCRE2 checks it). A valid run is encoded by `tokenizers`; an invalid run is one pre-token
of its own, its bytes spelled in the byte-level alphabet and given to the BPE model alone
(`tokenizer.model.tokenize`). This is the rule the C tokenizer documents; the golden ids
are computed here from `tokenizers`' model, not by the C code.

usage: tools/hf_tokenizer_fixture.py [OUT_DIR]   (default tests/engine/data/hf_tokenizer)
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

MULTILINGUAL = [
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "東京は日本の首都です。今日はいい天気ですね。",
    "我们在学习分词器，今天天气很好。",
    "مرحبا بالعالم، هذا اختبار.",
    "नमस्ते दुनिया, यह एक परीक्षण है।",
    "Γειά σου Κόσμε! Ελληνικά γράμματα.",
    "Ein Käse, bitte! Größe: 42 Äpfel, Übermut, Straße.",
    "emoji 😀😀 🎉 👍🏽 ❤️ 🇫🇷 and 👨‍👩‍👧",
]

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it, isn't it? We'd say 'hello'. I'M SURE WE'LL, DON'T",
    "Numbers: 3.14159, 2026-11-30, 1234567890 and 1,000,000 apples! 007",
    "  leading spaces,   runs of spaces\tand tabs\n\nand blank lines\r\n\r\n  \n",
    "trailing spaces   ",
    "   ",
    "\n\n\n",
    "a\u00a0b\u2003c\u3000d and NEL\u0085here \u2028 end",
    "Съешь же ещё этих мягких булок",
    "東京は日本の首都です。",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "emoji 😀😀 🎉 👍🏽 ❤️ 🇫🇷 👨‍👩‍👧 end",
    "mixed:Käse42東京😀x 'quote' \"double\" (parens) [brackets] {braces} <tags>",
    "code: for (int i = 0; i < n; i++) { x += y[i] * 2; }\n\tif (a != b) return -1;",
    "zzzz\nzzzz zzzz",
    "<|end_of_text|> inside <|begin_of_text|>text<|end_of_text|>",
    "<|endoftext|>two<|endoftext|><|endoftext|>",
    "<|im_start|>user\nhi<|im_end|>",
    "",
    "x",
    "Ωmega ω ΩΩ",
]

INVALID = [
    b"bytes \xff\xfe not utf-8",
    b"\xc3 lone lead byte and \x80 lone continuation",
    b"truncated \xe6\x9d at the end \xe6\x9d",
    b"\xed\xa0\x80 surrogate \xc0\xaf overlong",
    b"ok \xf4\x90\x80\x80 above U+10FFFF",
    b"\x00\x01\x02 control bytes \x7f",
    b"\xff",
]


def utf8_len(b, i):
    """Length of the valid UTF-8 character at b[i], or 0."""
    for k in (1, 2, 3, 4):
        try:
            b[i:i + k].decode("utf-8", "strict")
            return k
        except UnicodeDecodeError:
            continue
    return 0


def runs(b):
    """[(bytes, valid)] maximal runs of valid UTF-8 and of bytes that are not."""
    out, i, start, valid = [], 0, 0, None
    while i < len(b):
        k = utf8_len(b, i)
        v = k > 0
        if valid is not None and v != valid:
            out.append((b[start:i], valid))
            start = i
        valid = v
        i += k if k else 1
    if start < len(b):
        out.append((b[start:], valid))
    return out


def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for c in range(256):
        if c not in bs:
            bs.append(c)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


ALPHA = byte_alphabet()


def corpus():
    text = []
    for name in ("computers", "science"):
        with open(os.path.join("/usr/share/games/fortunes", name), encoding="utf-8",
                  errors="replace") as f:
            text += [r.strip() for r in f.read().split("\n%\n") if r.strip()]
    # numbers often enough that digit merges exist: Llama 3's \p{N}{1,3} then differs
    # from Qwen2's single digits
    numbers = [f"In {1990 + i % 40}, {i * 37 % 1000} of {i * 101 % 10000} cost {i % 100}.99"
               for i in range(400)]
    return text + MULTILINGUAL * 20 + numbers


def train(pre, specials, bos):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    tok.add_special_tokens(specials)  # after the model's ids, as Llama 3 and Qwen2 have them
    if bos:
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))]),
        ])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def golden(tok, bos_id):
    lines = []
    for t in TEXTS:
        ids = tok.encode(t, add_special_tokens=False).ids
        ids_sp = tok.encode(t).ids
        assert tok.decode(ids, skip_special_tokens=False) == t, t
        lines.append({"hex": t.encode().hex(), "ids": ids, "ids_special": ids_sp, "utf8": True})
    for b in INVALID:
        ids = []
        for piece, valid in runs(b):
            if valid:
                ids += tok.encode(piece.decode(), add_special_tokens=False).ids
            else:
                ids += [t.id for t in tok.model.tokenize("".join(ALPHA[c] for c in piece))]
        sp = ([bos_id] if bos_id is not None else []) + ids
        lines.append({"hex": b.hex(), "ids": ids, "ids_special": sp, "utf8": False})
    return lines


PRE_TEXTS = ["Hello, world! How are you?", "  two  spaces,,and. punctuation!! ", "a", "",
             "the green tree sees good food, too", "Käse, 東京! 😀", "eerie  oboe",
             "x<|end_of_text|>y z<|begin_of_text|> <|end_of_text|>"]


def pre_tokenizer_variants(text, path):
    """The same model under other pre-tokenizers, with ids from `tokenizers`."""
    # splits inside words (vowels, where merges cross) with adjacent matches ("ee", "e ")
    regex = Regex(r"\s|[eo,]")
    variants = []
    for behavior in ("removed", "isolated", "merged_with_previous", "merged_with_next",
                     "contiguous"):
        for invert in (False, True):
            variants.append(pre_tokenizers.Sequence([
                pre_tokenizers.Split(regex, behavior=behavior, invert=invert),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    variants.append(pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]))
    variants.append(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True))
    variants.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    with open(path, "w") as f:
        for pre in variants:
            tok = Tokenizer.from_str(text)
            tok.pre_tokenizer = pre
            cases = [{"hex": t.encode().hex(), "ids": tok.encode(t, add_special_tokens=False).ids}
                     for t in PRE_TEXTS]
            spec = json.loads(tok.to_str())["pre_tokenizer"]
            f.write(json.dumps({"pre_tokenizer": spec, "cases": cases},
                               separators=(",", ":")) + "\n")


def write(out, name, tok, bos, merges_as_strings, extra_vocab=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    j = json.loads(tok.to_str())
    if extra_vocab:
        # a token no merge makes: with ignore_merges a pre-token spelled so is emitted
        # whole; without it, it would come out as single bytes
        j["model"]["vocab"][extra_vocab] = max(j["model"]["vocab"].values()) + 1
        for a in j["added_tokens"]:
            a["id"] += 1
        j["model"]["ignore_merges"] = True
        pp = j["post_processor"]
        for p in pp.get("processors", [pp]):
            for v in p.get("special_tokens", {}).values():
                v["ids"] = [i + 1 for i in v["ids"]]
    if merges_as_strings:
        j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                                for m in j["model"]["merges"]]
    else:
        j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m
                                for m in j["model"]["merges"]]
    text = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
    tok = Tokenizer.from_str(text)  # the goldens come from the file as written
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(text)
    bos_id = tok.token_to_id(bos) if bos else None
    with open(os.path.join(d, "golden.jsonl"), "w") as f:
        for line in golden(tok, bos_id):
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    if extra_vocab:
        pre_tokenizer_variants(text, os.path.join(d, "pre_tokenizers.jsonl"))
    print(f"{d}: vocab {tok.get_vocab_size()}, merges "
          f"{'strings' if merges_as_strings else 'pairs'}")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/engine/data/hf_tokenizer"
    split = lambda pattern: pre_tokenizers.Sequence([  # noqa: E731
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    llama = train(split(LLAMA3), ["<|begin_of_text|>", "<|end_of_text|>"], "<|begin_of_text|>")
    write(out, "llama3", llama, "<|begin_of_text|>", False, extra_vocab="zzzz")
    qwen = train(split(QWEN2), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None)
    write(out, "qwen2", qwen, None, True)
    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                 ["<|endoftext|>"], None)
    write(out, "gpt2", gpt2, None, True)
    import tokenizers
    print("tokenizers", tokenizers.__version__)


if __name__ == "__main__":
    main()
