#!/usr/bin/env python3
"""PyTorch reference of the starpu-dos example model (docs/model.md).

Builds the model of docs/model.md as plain fp32 CPU torch tensors, initialises it with the
splitmix64 scheme of the spec (bit-exact), draws batches from the corpus with the second
splitmix64 generator (bit-exact), trains it with torch.optim.AdamW (single-tensor path,
one thread, deterministic algorithms) and writes a fixture the C implementation is
compared against.

Output (default: model_torch_tiny.bin / .txt next to this script), little-endian:
    char[8]   magic "DOSREF01"
    u32 x 10  V, d, H, F, L, T, B, steps, accumulation, seed
    f64 x 5   lr, beta1, beta2, eps, weight_decay
    u64       P (total number of parameters)
    f32[P]    initial weights, flat order of docs/model.md
    i32[B*T]  token ids of the first micro-batch of step 0 (row by row)
    f64[steps] loss of each step (before that step's update; mean over the A micro-batches)
    f32[P]    weights after `steps` updates, flat order
and a .txt provenance file (UTC date, versions, command line, P, first and last loss).

Usage:  python model_torch.py [--steps N] [--accum A] [--out FILE.bin] ...
Requires the exact versions in requirements.txt (checked at start-up unless
--allow-other-versions is given).
"""
import argparse
import datetime
import math
import os
import platform
import shlex
import struct
import sys

import numpy as np

TORCH_VERSION = "2.15.0"   # pinned; see requirements.txt
NUMPY_VERSION = "2.4.6"

MAGIC = b"DOSREF01"
MASK64 = (1 << 64) - 1
BATCH_SEED_XOR = 0xD1B54A32D192ED03
RMS_EPS = 1e-5

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


class SplitMix64:
    """splitmix64 exactly as docs/model.md: Python ints masked to 64 bits."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def param_specs(V, d, H, F, L, T):
    """(name, shape, init) in the flat order of docs/model.md."""
    specs = [("tok_emb", (V, d), "uniform"), ("pos_emb", (T, d), "uniform")]
    for l in range(L):
        specs += [
            (f"ln1_w.{l}", (d,), "ones"),
            (f"w_qkv.{l}", (3 * d, d), "uniform"),
            (f"w_o.{l}", (d, d), "uniform"),
            (f"ln2_w.{l}", (d,), "ones"),
            (f"w_fc1.{l}", (F, d), "uniform"),
            (f"w_fc2.{l}", (d, F), "uniform"),
        ]
    specs += [("lnf_w", (d,), "ones"), ("w_head", (V, d), "uniform")]
    return specs


def param_count_formula(V, d, H, F, L, T):
    return V * d + T * d + L * (2 * d + 3 * d * d + d * d + 2 * F * d) + d + V * d


def init_params(specs, seed):
    """List of float32 numpy arrays, initialised as docs/model.md says."""
    rng = SplitMix64(seed)
    a = np.float32(0.02 * math.sqrt(3.0))
    two, one, scale = np.float32(2.0), np.float32(1.0), np.float32(2.0 ** -24)
    out = []
    for _name, shape, init in specs:
        count = int(np.prod(shape))
        if init == "ones":
            out.append(np.ones(shape, dtype=np.float32))
            continue
        k = np.array([rng.next() >> 40 for _ in range(count)], dtype=np.uint32)
        u = k.astype(np.float32) * scale          # exact: 24-bit integer times 2^-24
        w = (two * u - one) * a                   # fp32: 2u and 2u-1 exact, one rounding
        assert w.dtype == np.float32
        out.append(w.reshape(shape))
    return out


class BatchStream:
    """Second generator: micro-batches in order, B sequences each."""

    def __init__(self, corpus, seed, B, T):
        self.corpus = corpus
        self.rng = SplitMix64(seed ^ BATCH_SEED_XOR)
        self.B, self.T = B, T
        self.N = len(corpus)
        if self.N <= T:
            raise ValueError(f"corpus of {self.N} bytes is too short for T={T}")

    def next(self):
        ids = np.empty((self.B, self.T), dtype=np.int64)
        tgt = np.empty((self.B, self.T), dtype=np.int64)
        for b in range(self.B):
            start = self.rng.next() % (self.N - self.T)
            ids[b] = self.corpus[start:start + self.T]
            tgt[b] = self.corpus[start + 1:start + self.T + 1]
        return ids, tgt


def forward(torch, p, ids, tgt, V, d, H, F, L, T):
    """Loss of one micro-batch (docs/model.md, written out in plain torch ops)."""
    Fn = torch.nn.functional
    B = ids.shape[0]
    n = B * T
    hd = d // H
    tok_emb, pos_emb = p[0], p[1]
    lnf_w, w_head = p[2 + 6 * L], p[3 + 6 * L]

    def rmsnorm(x, w):
        return x * (1.0 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS)) * w

    ids_t = torch.from_numpy(ids.reshape(-1))
    pos_t = torch.arange(T, dtype=torch.int64).repeat(B)   # t = index within its sequence
    x = tok_emb[ids_t] + pos_emb[pos_t]                    # [n, d]
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scale = math.sqrt(hd)

    def heads(m):   # [n, d] -> [B, H, T, hd]; head h = columns [h*hd, (h+1)*hd)
        return m.reshape(B, T, H, hd).transpose(1, 2)

    for l in range(L):
        ln1_w, w_qkv, w_o, ln2_w, w_fc1, w_fc2 = p[2 + 6 * l:8 + 6 * l]
        h1 = rmsnorm(x, ln1_w)
        qkv = h1 @ w_qkv.T                                 # [n, 3d]
        q, k, v = heads(qkv[:, 0:d]), heads(qkv[:, d:2 * d]), heads(qkv[:, 2 * d:3 * d])
        scores = q @ k.transpose(-1, -2) / scale           # [B, H, T, T]
        scores = scores.masked_fill(causal, float("-inf"))
        att = torch.softmax(scores, dim=-1) @ v            # [B, H, T, hd]
        att = att.transpose(1, 2).reshape(n, d)            # head h back to cols [h*hd, (h+1)*hd)
        x = x + att @ w_o.T
        h2 = rmsnorm(x, ln2_w)
        x = x + Fn.gelu(h2 @ w_fc1.T) @ w_fc2.T            # exact (erf) GELU
    hf = rmsnorm(x, lnf_w)
    logits = hf @ w_head.T                                 # [n, V]
    return Fn.cross_entropy(logits, torch.from_numpy(tgt.reshape(-1)))


def flat(torch, params):
    return torch.cat([q.detach().reshape(-1) for q in params]).numpy().astype("<f4")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", "-V", type=int, default=256)
    ap.add_argument("--dim", "-d", type=int, default=32)
    ap.add_argument("--heads", "-H", type=int, default=2)
    ap.add_argument("--ffn", "-F", type=int, default=64)
    ap.add_argument("--layers", "-L", type=int, default=2)
    ap.add_argument("--seq", "-T", type=int, default=16)
    ap.add_argument("--batch", "-B", type=int, default=4)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--accum", "-A", type=int, default=1,
                    help="micro-batches per step (gradient accumulation)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--data", default=os.path.join(REPO, "data", "corpus.txt"))
    ap.add_argument("--out", default=os.path.join(HERE, "model_torch_tiny.bin"),
                    help="fixture path; provenance goes to the same name with .txt")
    ap.add_argument("--allow-other-versions", action="store_true")
    args = ap.parse_args()

    import torch

    if not args.allow_other_versions:
        if torch.__version__.split("+")[0] != TORCH_VERSION or np.__version__ != NUMPY_VERSION:
            sys.exit(f"need torch=={TORCH_VERSION} numpy=={NUMPY_VERSION}, have "
                     f"torch {torch.__version__} numpy {np.__version__} "
                     f"(or pass --allow-other-versions)")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    V, d, H, F, L, T, B = (args.vocab, args.dim, args.heads, args.ffn, args.layers,
                           args.seq, args.batch)
    A, steps, seed = args.accum, args.steps, args.seed
    if d % H != 0:
        sys.exit(f"d={d} is not a multiple of H={H}")
    if V != 256:
        sys.exit("the corpus is tokenised by bytes: V must be 256")
    if A < 1 or steps < 1 or not (0 <= seed < 2 ** 32):
        sys.exit("need accum >= 1, steps >= 1 and a 32-bit seed")

    with open(args.data, "rb") as f:
        corpus = np.frombuffer(f.read(), dtype=np.uint8)

    specs = param_specs(V, d, H, F, L, T)
    P = sum(int(np.prod(s)) for _, s, _ in specs)
    assert P == param_count_formula(V, d, H, F, L, T), "parameter count != formula"

    init = init_params(specs, seed)
    params = [torch.from_numpy(w.copy()).requires_grad_(True) for w in init]
    assert all(q.dtype == torch.float32 and q.is_leaf for q in params)
    w0 = flat(torch, params)

    opt = torch.optim.AdamW(params, lr=args.lr, betas=(args.beta1, args.beta2),
                            eps=args.eps, weight_decay=args.weight_decay,
                            foreach=False, fused=False)
    stream = BatchStream(corpus, seed, B, T)
    first_ids = None
    losses = []
    for _step in range(steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _mb in range(A):
            ids, tgt = stream.next()
            if first_ids is None:
                first_ids = ids.astype("<i4")
            loss = forward(torch, params, ids, tgt, V, d, H, F, L, T)
            total += float(loss.item())
            # the 1/A of the accumulated mean is folded into each micro-batch's gradient
            (loss if A == 1 else loss / A).backward()
        losses.append(total / A)
        opt.step()
    w1 = flat(torch, params)

    blob = bytearray(MAGIC)
    blob += struct.pack("<10I", V, d, H, F, L, T, B, steps, A, seed)
    blob += struct.pack("<5d", args.lr, args.beta1, args.beta2, args.eps, args.weight_decay)
    blob += struct.pack("<Q", P)
    blob += w0.tobytes()
    blob += first_ids.reshape(-1).tobytes()
    blob += np.asarray(losses, dtype="<f8").tobytes()
    blob += w1.tobytes()
    expected = 8 + 40 + 40 + 8 + 4 * P + 4 * B * T + 8 * steps + 4 * P
    assert len(blob) == expected
    with open(args.out, "wb") as f:
        f.write(blob)

    txt = os.path.splitext(args.out)[0] + ".txt"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cmd = " ".join(shlex.quote(a) for a in [os.path.basename(sys.argv[0])] + sys.argv[1:])
    lines = [
        f"starpu-dos model reference ({os.path.basename(args.out)})",
        f"generated_utc: {now}",
        f"command: python {cmd}",
        f"torch: {torch.__version__}",
        f"aten_cpu_capability: {torch.backends.cpu.get_cpu_capability()}",
        f"numpy: {np.__version__}",
        f"python: {platform.python_version()}",
        f"torch_threads: {torch.get_num_threads()}  deterministic_algorithms: True",
        "optimizer: torch.optim.AdamW fp32 CPU single-tensor path (foreach=False fused=False)",
        f"config: V={V} d={d} H={H} F={F} L={L} T={T} B={B} steps={steps} accum={A} "
        f"seed={seed}",
        f"adamw: lr={args.lr!r} betas=({args.beta1!r}, {args.beta2!r}) eps={args.eps!r} "
        f"weight_decay={args.weight_decay!r}",
        f"corpus: {os.path.relpath(args.data, REPO)} ({len(corpus)} bytes)",
        f"P: {P}",
        f"bin_bytes: {len(blob)}",
        f"loss_first: {losses[0]!r}",
        f"loss_last: {losses[-1]!r}",
        f"ln(V): {math.log(V)!r}",
    ]
    with open(txt, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
