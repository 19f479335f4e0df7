#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/ that are binary or built from formats
(the text seeds are kept as they are). Run from the repository root; outside CI.

A seed that holds several files separates them with tests/fuzz/fuzz_util.h's TPD_FUZZ_SEP.
The checkpoint manifest seeds are real manifests written by `tripod train` and are kept as
they are."""
import json
import os
import struct

SEP = b"\n--8<--\n"
ROOT = "tests/fuzz/corpus"


def put(name, file, data):
    os.makedirs(os.path.join(ROOT, name), exist_ok=True)
    with open(os.path.join(ROOT, name, file), "wb") as f:
        f.write(data)


# ---- Megatron indexed data set: PREFIX.idx, SEP, PREFIX.bin ----
DTYPES = {"uint8": (1, "B"), "int16": (3, "h"), "int32": (4, "i"), "int64": (5, "q"),
          "uint16": (8, "H")}


def megatron(docs, dtype):
    code, fmt = DTYPES[dtype]
    size = struct.calcsize(fmt)
    idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, code, len(docs), len(docs) + 1)
    idx += b"".join(struct.pack("<i", len(d)) for d in docs)
    at = 0
    for d in docs:
        idx += struct.pack("<q", at)
        at += len(d) * size
    idx += b"".join(struct.pack("<q", i) for i in range(len(docs) + 1))
    binary = b"".join(struct.pack("<" + fmt, t) for d in docs for t in d)
    return idx + SEP + binary


put("fuzz_megatron", "uint16_two_docs", megatron([[1, 2, 3, 50256], [7, 8, 9, 10, 11, 12]], "uint16"))
put("fuzz_megatron", "int32_one_doc", megatron([list(range(20))], "int32"))
put("fuzz_megatron", "uint8_three_docs", megatron([[1], [2, 3], [4, 5, 6, 7, 8, 9]], "uint8"))
put("fuzz_megatron", "int64_one_doc", megatron([[5, 6, 7, 8, 9, 10]], "int64"))
put("fuzz_megatron", "empty", megatron([], "uint16"))


# ---- llm.c token shard: 256 int32 header [20240520, 1, ntok], ntok uint16 ----
def shard(tokens, magic=20240520, version=1):
    hdr = [magic, version, len(tokens)] + [0] * 253
    return struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(tokens), *tokens)


put("fuzz_llmc_shard", "two_docs", shard([50256, 1, 2, 3, 50256, 4, 5, 6, 7, 8]))
put("fuzz_llmc_shard", "one_token", shard([42]))
put("fuzz_llmc_shard", "empty", shard([]))


# ---- safetensors of a one-layer GPT-2 (n_embd 8, n_head 2, vocab 11, 4 positions) ----
def safetensors(extra=None):
    C, V, T = 8, 11, 4
    shapes = {
        "wte.weight": [V, C], "wpe.weight": [T, C],
        "h.0.ln_1.weight": [C], "h.0.ln_1.bias": [C],
        "h.0.attn.c_attn.weight": [C, 3 * C], "h.0.attn.c_attn.bias": [3 * C],
        "h.0.attn.c_proj.weight": [C, C], "h.0.attn.c_proj.bias": [C],
        "h.0.ln_2.weight": [C], "h.0.ln_2.bias": [C],
        "h.0.mlp.c_fc.weight": [C, 4 * C], "h.0.mlp.c_fc.bias": [4 * C],
        "h.0.mlp.c_proj.weight": [4 * C, C], "h.0.mlp.c_proj.bias": [C],
        "ln_f.weight": [C], "ln_f.bias": [C],
    }
    shapes = {"transformer." + name: shape for name, shape in shapes.items()}
    shapes.update(extra or {})  # more tensors, after these in the data
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for i, (name, shape) in enumerate(shapes.items()):
        n = 1
        for s in shape:
            n *= s
        blob = struct.pack("<%df" % n, *[(i + j % 7) * 0.01 for j in range(n)])
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


put("fuzz_safetensors", "gpt2_one_layer", safetensors())
put("fuzz_safetensors", "with_skipped_entries", safetensors(
    {"transformer.h.0.attn.bias": [1], "lm_head.weight": [11, 8]}))
put("fuzz_safetensors", "header_only", struct.pack("<Q", 2) + b"{}")


# ---- llm.c model file: 256 int32 header [20240326, 3, maxT, V, L, NH, C, Vp], fp32 ----
def llmc_model(h, floats=None):
    T, V, L, NH, C, Vp = h
    n = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C if floats is None else floats
    hdr = struct.pack("<256i", *([20240326, 3] + h + [0] * 248))
    return hdr + struct.pack("<%df" % n, *[0.01 * (i % 7) for i in range(n)])


put("fuzz_llmc_model", "one_layer", llmc_model([4, 11, 1, 2, 8, 16]))
put("fuzz_llmc_model", "padded_vocab_2e30", llmc_model([4, 11, 1, 2, 8, 1 << 30], 0))
put("fuzz_llmc_model", "truncated", llmc_model([4, 11, 1, 2, 8, 16], 100))

# ---- GPT-2 tokenizer files: vocab.json, SEP, merges.txt ----
with open("tests/engine/data/bpe/vocab.json", "rb") as f:
    vocab = f.read()
with open("tests/engine/data/bpe/merges.txt", "rb") as f:
    merges = f.read()
put("fuzz_bpe", "test_tokenizer", vocab + SEP + merges)
put("fuzz_bpe", "no_merges", vocab + SEP + b"#version: 0.2\n")
put("fuzz_bpe", "crlf_merges", vocab + SEP + merges.replace(b"\n", b"\r\n")[:400])


def byte_alphabet():
    """GPT-2's printable spelling of the 256 bytes (bytes_to_unicode)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


alpha = byte_alphabet()
tiny = {alpha[b]: b for b in range(256)}
tiny.update({"\u0120t": 256, "he": 257, "\u0120the": 258, "<|endoftext|>": 259})
tiny_vocab = json.dumps(tiny, ensure_ascii=False).encode()
put("fuzz_bpe", "byte_alphabet", tiny_vocab + SEP + "#version: 0.2\n\u0120 t\nh e\n\u0120t he\n".encode())
put("fuzz_bpe", "bad_merge_line", vocab + SEP + b"#version: 0.2\n\xc4\xa0 t\nh e x\n")
