#!/usr/bin/env python3
"""The bf16 training recipe of the cuda backend emulated on the cpu, against fp32: the sizes
of the differences `tripod verify --device cuda` budgets for (engine/verify/verify_budget.c).

A GPT-2 block stack as `tripod verify` shrinks it (configs/demo.yaml by default: 4 layers,
hidden 64, 4 heads, FFN 32, vocabulary 129, sequence 8, 16 samples a step, AdamW at lr 3e-3,
betas 0.9/0.95, eps 1e-6, weight decay 0.1 on 2-D weights, clip 1.0) trains S steps twice
from the same weights and tokens: in fp32, and with every tensor the cuda backend keeps in
bf16 rounded to bf16 where it is written (the embedding's output, the residual stream, the
norms' outputs, every GEMM's output after its bias, GELU, the attention probabilities before
P.V and its output, the logits; and in the backward every activation gradient), the weights
rounded from fp32 masters, GEMMs summed in fp32, weight gradients accumulated in fp32 (fp32
main gradients). It prints, per depth, the worst over seeds of: the per-step relative loss
and grad-norm differences, and per tensor ||dθ_bf16 - dθ_fp32|| / ||dθ_fp32|| (dθ: how far
the run moved from the initial weights), without the key bias (its gradient is zero in exact
arithmetic) and with it. Needs PyTorch (cpu). An estimate of sizes, not a proof: the cuda
kernels' own orders of summation differ.

usage: tools/bf16_emulate.py [--layers 4,16] [--steps 3] [--seeds 8]
"""
import argparse
import math

import torch

torch.set_default_dtype(torch.float32)


class _Round(torch.autograd.Function):
    """Rounds to bf16 in the forward and the gradient in the backward (bf16 activations)."""

    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(torch.float32)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(torch.float32)


class _RoundFwd(torch.autograd.Function):
    """The bf16 copy of an fp32 master weight: its gradient reaches the master in fp32."""

    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(torch.float32)

    @staticmethod
    def backward(ctx, g):
        return g


def make_params(L, C, F, V, T, std, gen):
    def n(*shape, s=std):
        return torch.randn(*shape, generator=gen) * s

    p = {"wte": n(V, C), "wpe": n(T, C), "lnfw": torch.ones(C), "lnfb": torch.zeros(C)}
    for l in range(L):
        p[f"{l}.ln1w"], p[f"{l}.ln1b"] = torch.ones(C), torch.zeros(C)
        p[f"{l}.qkvw"], p[f"{l}.qkvb"] = n(3 * C, C), torch.zeros(3 * C)
        p[f"{l}.projw"], p[f"{l}.projb"] = n(C, C, s=std / math.sqrt(2 * L)), torch.zeros(C)
        p[f"{l}.ln2w"], p[f"{l}.ln2b"] = torch.ones(C), torch.zeros(C)
        p[f"{l}.fcw"], p[f"{l}.fcb"] = n(F, C), torch.zeros(F)
        p[f"{l}.fcprojw"], p[f"{l}.fcprojb"] = n(C, F, s=std / math.sqrt(2 * L)), torch.zeros(C)
    return p


def loss_fn(p, tok, tgt, L, NH, bf16):
    r = _Round.apply if bf16 else (lambda x: x)
    w = _RoundFwd.apply if bf16 else (lambda x: x)
    B, T = tok.shape
    C = p["wte"].shape[1]
    HS = C // NH

    def ln(x, g, b):
        m = x.mean(-1, keepdim=True)
        v = ((x - m) ** 2).mean(-1, keepdim=True)
        return r((x - m) / torch.sqrt(v + 1e-5) * g + b)

    def lin(x, W, b):
        return r(x @ w(W).t() + b)

    x = r(w(p["wte"])[tok] + w(p["wpe"])[:T])
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(L):
        h = ln(x, p[f"{l}.ln1w"], p[f"{l}.ln1b"])
        qkv = lin(h, p[f"{l}.qkvw"], p[f"{l}.qkvb"]).view(B, T, 3, NH, HS)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HS)  # fp32 scores
        a = r(torch.softmax(s.masked_fill(mask, float("-inf")), -1))
        y = r(a @ v).transpose(1, 2).reshape(B, T, C)
        x = r(x + lin(y, p[f"{l}.projw"], p[f"{l}.projb"]))
        h = ln(x, p[f"{l}.ln2w"], p[f"{l}.ln2b"])
        f = r(torch.nn.functional.gelu(lin(h, p[f"{l}.fcw"], p[f"{l}.fcb"]), approximate="tanh"))
        x = r(x + lin(f, p[f"{l}.fcprojw"], p[f"{l}.fcprojb"]))
    h = ln(x, p["lnfw"], p["lnfb"])
    logits = r(h @ w(p["wte"]).t())
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


def train(p0, data, a, L, bf16):
    p = {k: v.clone().requires_grad_(True) for k, v in p0.items()}
    m = {k: torch.zeros_like(v) for k, v in p0.items()}
    s2 = {k: torch.zeros_like(v) for k, v in p0.items()}
    losses, norms = [], []
    for step, (tok, tgt) in enumerate(data, 1):
        for v in p.values():
            v.grad = None
        micro = tok.shape[0] // a.mbs
        total = 0.0
        for j in range(micro):  # gradients summed over micro-batches in fp32
            sl = slice(j * a.mbs, (j + 1) * a.mbs)
            loss = loss_fn(p, tok[sl], tgt[sl], L, a.heads, bf16) / micro
            loss.backward()
            total += loss.item()
        norm = math.sqrt(sum(float((v.grad.double() ** 2).sum()) for v in p.values()))
        clip = min(1.0, a.clip / (norm + 1e-6))
        with torch.no_grad():
            for k, v in p.items():
                g = v.grad * clip
                m[k].mul_(0.9).add_(g, alpha=0.1)
                s2[k].mul_(0.95).addcmul_(g, g, value=0.05)
                mh, vh = m[k] / (1 - 0.9**step), s2[k] / (1 - 0.95**step)
                if v.dim() == 2 and k != "wpe":
                    v.mul_(1 - a.lr * 0.1)
                v.sub_(a.lr * mh / (vh.sqrt() + a.eps))
        losses.append(total)
        norms.append(norm)
    return losses, norms, {k: v.detach() for k, v in p.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="4,16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=129)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--mbs", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--clip", type=float, default=1.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    for L in (int(x) for x in a.layers.split(",")):
        worst = {"loss": [0.0] * a.steps, "norm": [0.0] * a.steps, "param": 0.0, "param_k": 0.0}
        where = ""
        for seed in range(a.seeds):
            gen = torch.Generator().manual_seed(seed)
            p0 = make_params(L, a.hidden, a.ffn, a.vocab, a.seq, 0.02, gen)
            data = []
            for _ in range(a.steps):
                t = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
                data.append((t[:, :-1], t[:, 1:]))
            l32, n32, p32 = train(p0, data, a, L, False)
            l16, n16, p16 = train(p0, data, a, L, True)
            for i in range(a.steps):
                worst["loss"][i] = max(worst["loss"][i], abs(l16[i] - l32[i]) / abs(l32[i]))
                worst["norm"][i] = max(worst["norm"][i], abs(n16[i] - n32[i]) / abs(n32[i]))
            for k in p0:
                d16, d32 = p16[k] - p0[k], p32[k] - p0[k]
                full = float((d16 - d32).norm() / d32.norm().clamp_min(1e-30))
                if k.endswith("qkvb"):  # without the key bias rows
                    C = a.hidden
                    keep = torch.cat([torch.arange(0, C), torch.arange(2 * C, 3 * C)])
                    d16, d32 = d16[keep], d32[keep]
                e = float((d16 - d32).norm() / d32.norm().clamp_min(1e-30))
                if e > worst["param"]:
                    worst["param"], where = e, f"{k} (seed {seed})"
                worst["param_k"] = max(worst["param_k"], full)
        print(f"layers {L}: loss " + " ".join(f"{x:.2e}" for x in worst["loss"]) +
              "; grad norm " + " ".join(f"{x:.2e}" for x in worst["norm"]) +
              f"; params {worst['param']:.3f} at {where} (with the key bias {worst['param_k']:.3f})"
              f", worst of {a.seeds} seeds, {a.steps} steps")


if __name__ == "__main__":
    main()
