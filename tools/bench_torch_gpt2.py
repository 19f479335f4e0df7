#!/usr/bin/env python3
"""PyTorch eager GPT-2 training-step throughput on the CPU, as a baseline for tripod.

The model follows tripod's GPT-2 semantics (shared/DESIGN.md, "Model semantics (GPT-2)"):
learned position embeddings, pre-LayerNorm (eps 1e-5, biased variance), tanh GELU, causal
attention scaled by 1/sqrt(head_dim) (scaled_dot_product_attention with is_causal=True),
biases on every linear, the LM head tied to the token embedding, the vocabulary padded to
--padded-vocab rows (padded logits never enter the softmax), AdamW with weight decay on
2-D weights only, and gradient clipping at global norm 1.0. One step is one micro-batch
(forward, backward, clip, optimizer step), as tripod's bench with
global_batch_size == micro_batch_size. Tokens are random: the work per token is the same.

--dtype bf16 is PyTorch's standard CPU mixed precision: torch.autocast("cpu",
dtype=torch.bfloat16) around forward and loss, fp32 weights, gradients and optimizer.

FLOPs per step are tripod's (engine/model/model_flops.c, tpd_model_flops), Megatron's
formula with attention and the LM head, times 3 for forward and backward:
    3 * B*s * (L * (2*(4h^2 + 2*h*f) + 4*s*h) + 2*h*Vp),   f = 4h (ffn_hidden_size)
where 2*(2h^2 + 2h*h) are QKV and the output projection, 2*2*h*f the MLP, 4*s*h the
attention scores and the weighted sum (full s x s, not halved for the causal mask), and
2*h*Vp the LM head over the padded vocabulary.

Prints one line:
  torch dtype=bf16 model=NAME seq=S mb=B threads=T steps=N ms/step=X tokens/s=Y TFLOP/s=Z
ms/step is the mean over the measured steps (after --warmup steps), as tripod bench's.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, h, heads, ffn):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h, eps=1e-5)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h, eps=1e-5)
        self.fc = nn.Linear(h, ffn)
        self.fc_proj = nn.Linear(ffn, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        # default scale is 1/sqrt(head_dim)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, layers, h, heads, vocab, padded_vocab, seq):
        super().__init__()
        self.vocab = vocab
        self.wte = nn.Embedding(padded_vocab, h)
        self.wpe = nn.Embedding(seq, h)
        self.blocks = nn.ModuleList(Block(h, heads, 4 * h) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h, eps=1e-5)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            else:
                nn.init.zeros_(p)
        for blk in self.blocks:
            nn.init.ones_(blk.ln1.weight)
            nn.init.ones_(blk.ln2.weight)
        nn.init.ones_(self.ln_f.weight)

    def forward(self, idx, targets):
        s = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(s, device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head, padded rows computed
        logits = logits[..., : self.vocab]  # padded logits never enter the softmax
        return F.cross_entropy(logits.reshape(-1, self.vocab).float(), targets.reshape(-1))


def model_flops(layers, h, seq, padded_vocab, mb):
    """tpd_model_flops (engine/model/model_flops.c) for a dense GPT-2 with f = 4h."""
    f = 4.0 * h
    layer = 2.0 * (2.0 * h * h + 2.0 * h * h + 2.0 * h * f) + 4.0 * seq * h
    return 3.0 * mb * seq * (layers * layer + 2.0 * h * padded_vocab)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257, help="vocabulary (unpadded)")
    ap.add_argument("--padded-vocab", type=int, default=0,
                    help="rows of the embedding and LM head (default: vocab rounded up to "
                         "--divisible-by)")
    ap.add_argument("--divisible-by", type=int, default=128)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--name", default="", help="model label in the output line")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()

    vp = a.padded_vocab or -(-a.vocab // a.divisible_by) * a.divisible_by
    name = a.name or f"L{a.layers}-h{a.hidden}"
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    model = GPT2(a.layers, a.hidden, a.heads, a.vocab, vp, a.seq)
    model.train()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=6e-4, betas=(0.9, 0.95), eps=1e-8)

    g = torch.Generator().manual_seed(a.seed)

    def batch():
        t = torch.randint(0, a.vocab, (a.micro_batch, a.seq + 1), generator=g)
        return t[:, :-1].contiguous(), t[:, 1:].contiguous()

    def step(idx, tgt):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step(*batch())
    data = [batch() for _ in range(a.steps)]  # drawn outside the timed region
    t0 = time.perf_counter()
    for idx, tgt in data:
        loss = step(idx, tgt)
    loss = loss.item()
    dt = (time.perf_counter() - t0) / a.steps
    if not math.isfinite(loss):
        raise SystemExit(f"bench_torch_gpt2: loss is {loss}")

    flops = model_flops(a.layers, a.hidden, a.seq, vp, a.micro_batch)
    print(f"torch dtype={a.dtype} model={name} seq={a.seq} mb={a.micro_batch} "
          f"threads={a.threads} steps={a.steps} ms/step={dt * 1e3:.2f} "
          f"tokens/s={a.micro_batch * a.seq / dt:.0f} TFLOP/s={flops / dt / 1e12:.4f} "
          f"loss={loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
