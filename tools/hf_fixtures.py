#!/usr/bin/env python3
"""Writes the Hugging Face agreement fixtures of tests/engine/checkpoint/hf/.

Not part of the product or of CI: it needs torch, transformers and tokenizers
(`pip install torch transformers tokenizers safetensors`), and its output is committed.
`hf_fixtures.py NAME ...` writes only the fixtures named.
`hf_fixtures.py --check DIR NAME` loads a folder written by `tripod export --format hf`
with transformers and compares its logits with fixture NAME's.

For each tiny random model (LlamaForCausalLM with grouped-query attention, an untied head
and rope_theta != 10000; the same with Llama 3.1's "llama3" rope scaling and a tied head;
Qwen2ForCausalLM with its QKV biases and a tied head; GPT2LMHeadModel; MixtralForCausalLM,
4 experts, top-2; Qwen2MoeForCausalLM, 4 experts, top-2 renormalized, a gated shared
expert (and the same with dense layers between the MoE ones: mlp_only_layers 1 and 3 of 4);
Qwen3ForCausalLM with its per-head q_norm and k_norm; Qwen3MoeForCausalLM, 4
experts, top-2 renormalized, no shared expert, heads of 16 where hidden_size / heads is 8,
as in Qwen3's MoE models) it writes, under tests/engine/checkpoint/hf/<name>/:
  model/          the model folder from save_pretrained (sharded for Llama, with
                  model.safetensors.index.json), in bf16 (Llama), fp32 (Qwen2) or fp16
                  (GPT-2), plus a tokenizer.json trained for its vocabulary (Llama);
  golden.json     tokens (seq_length ids), targets (the tokens shifted left by one,
                  cyclically: what tripod's sampler reads from a stream that repeats
                  them), the mean cross-entropy loss, and the transformers versions;
  logits.f32      the (seq_length, vocab_size) fp32 logits, little-endian.
The weights are drawn at a larger scale than the default init, and the norm weights
around 1, so that a wrong mapping changes the logits by far more than the tolerance. The
logits come from the model reloaded in fp32 from the saved files, so they are the exact
function of the weights that tripod imports.
"""
import json
import os
import sys

import torch
import transformers
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "engine",
                    "checkpoint", "hf")
SEQ = 16
VOCAB = 300


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name or "ln_" in name) and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


def tokenizer_json(path):
    """A byte-level BPE with Llama 3's pre-tokenizer, trained on a few sentences to
    exactly VOCAB ids (special tokens last, as in Llama 3)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
           r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - len(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["The quick brown fox jumps over the lazy dog. " * 3,
            "Pack my box with five dozen liquor jugs; it's 2026 and we'll train 3D models.",
            "Tensor, pipeline and data parallel layouts train the same model."] * 20
    tok.train_from_iterator(text, trainer)
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)])
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    tok.save(path)
    return tok


ONLY = set()  # the fixtures to write; empty: all of them


def write(name, model, dtype, shard):
    if ONLY and name not in ONLY:
        return
    out = os.path.join(ROOT, name)
    folder = os.path.join(out, "model")
    os.makedirs(folder, exist_ok=True)
    model.to(dtype).save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
    cls = type(model)
    ref = cls.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, model.config.vocab_size, (SEQ,), generator=g)
    targets = torch.roll(tokens, -1)
    with torch.no_grad():
        logits = ref(tokens[None, :]).logits[0].float()  # (SEQ, vocab)
    loss = torch.nn.functional.cross_entropy(logits, targets).item()
    with open(os.path.join(out, "logits.f32"), "wb") as f:
        f.write(logits.contiguous().numpy().astype("<f4").tobytes())
    golden = {"tokens": tokens.tolist(), "targets": targets.tolist(), "loss": loss,
              "seq_length": SEQ, "vocab_size": model.config.vocab_size,
              "torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"{name}: loss {loss:.6f}, files {sorted(os.listdir(folder))}")


def check(export_dir, name):
    """Loads a folder that `tripod export --format hf` wrote with transformers' Auto
    classes and compares its logits on the fixture's tokens with the fixture's."""
    from transformers import AutoModelForCausalLM
    import numpy as np
    golden = json.load(open(os.path.join(ROOT, name, "golden.json")))
    want = np.fromfile(os.path.join(ROOT, name, "logits.f32"), dtype="<f4")
    model = AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    with torch.no_grad():
        got = model(torch.tensor([golden["tokens"]])).logits[0].float().numpy().reshape(-1)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"{export_dir}: {type(model).__name__} loads; logits max rel error {err:.2e} "
          f"against {name}")
    return 0 if err < 1e-2 else 1


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        return check(sys.argv[2], sys.argv[3])
    ONLY.update(sys.argv[1:])
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=50000.0, tie_word_embeddings=False,
        bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1))
    perturb(llama, 1)
    write("llama", llama, torch.bfloat16, "60KB")
    tokenizer_json(os.path.join(ROOT, "llama", "model", "tokenizer.json"))

    # Llama 3.1's "llama3" rope scaling, with a short original context so that the head's
    # 8 frequency pairs fall in all three bands (kept, blended, divided by the factor)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    llama31 = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=dict(scaling, rope_theta=20000.0)))
    assert llama31.config.rope_parameters["rope_type"] == "llama3"
    perturb(llama31, 4)
    write("llama31", llama31, torch.float32, "10MB")

    qwen = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        use_sliding_window=False))
    perturb(qwen, 2)
    write("qwen2", qwen, torch.float32, "10MB")

    mixtral = MixtralForCausalLM(MixtralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, rms_norm_eps=1e-5,
        rope_theta=1000000.0, tie_word_embeddings=False, sliding_window=None,
        router_aux_loss_coef=0.02))
    perturb(mixtral, 5)
    write("mixtral", mixtral, torch.float32, "10MB")

    qwen_moe_cfg = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=32, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, use_sliding_window=False, decoder_sparse_step=1,
        mlp_only_layers=[])
    qwen_moe = Qwen2MoeForCausalLM(Qwen2MoeConfig(**qwen_moe_cfg))
    perturb(qwen_moe, 6)
    write("qwen2moe", qwen_moe, torch.float32, "10MB")

    # dense layers between the MoE ones (mlp_only_layers: layers 1 and 3, an MLP of
    # intermediate_size), tripod's model.moe_layer_freq 2
    qwen_moe_mixed = Qwen2MoeForCausalLM(Qwen2MoeConfig(**dict(
        qwen_moe_cfg, intermediate_size=48, shared_expert_intermediate_size=24,
        num_hidden_layers=4, mlp_only_layers=[1, 3])))
    perturb(qwen_moe_mixed, 10)
    write("qwen2moe_mixed", qwen_moe_mixed, torch.float32, "10MB")

    qwen3 = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        attention_bias=False, use_sliding_window=False))
    perturb(qwen3, 8)
    write("qwen3", qwen3, torch.float32, "10MB")

    qwen3_moe = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
        attention_bias=False, use_sliding_window=False, decoder_sparse_step=1,
        mlp_only_layers=[], router_aux_loss_coef=0.001))
    perturb(qwen3_moe, 9)
    write("qwen3moe", qwen3_moe, torch.float32, "10MB")

    gpt2 = GPT2LMHeadModel(GPT2Config(
        vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1))
    perturb(gpt2, 3)
    write("gpt2", gpt2, torch.float16, "10MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
