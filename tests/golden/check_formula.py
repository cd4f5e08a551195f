#!/usr/bin/env python3
"""Replay adam_torch.bin with a pure-numpy float32 emulation of candidate
per-element operation sequences and report the max ulp difference vs torch.

Usage:
  python check_formula.py [--bin adam_torch.bin] [--sqrt ieee|torch] [--all]
                          [--selftest]

  --sqrt ieee   (default) sqrt is the correctly rounded IEEE sqrtf (np.sqrt).
  --sqrt torch  use torch.sqrt itself as an oracle for the sqrt step only
                (needs torch); proves every other operation is bit-exact.
  --all         print per-checkpoint ulp rows, not only the per-case maximum.
  --selftest    check the exact-fma emulation against libm fmaf (ctypes).

Exact single-rounding fmaf emulation (fma32 below): a*b of two float32 is
exact in float64; s = RN64(a*b + c) and its exact error e come from TwoSum;
RN32(s) equals RN32(a*b + c) unless s is exactly a float32 rounding midpoint,
in which case the sign of e picks the side (e == 0: ties-to-even). No double
rounding. (Validated by --selftest against glibc fmaf.)
"""
import argparse
import math
import os
import struct
import sys

import numpy as np

f32 = np.float32
VEC_BODY = 32  # AVX512 cpu_kernel_vec: 2 x 16 floats per iteration


# ---------------------------------------------------------------- helpers
def fma32(a, b, c):
    a = np.asarray(a, f32)
    b = np.asarray(b, f32)
    c = np.asarray(c, f32)
    p = a.astype(np.float64) * b.astype(np.float64)          # exact
    cd = c.astype(np.float64)
    s = p + cd
    bp = s - cd
    e = (p - bp) + (cd - (s - bp))                           # TwoSum error, exact
    with np.errstate(over="ignore", invalid="ignore"):
        r = s.astype(f32)
        rd = r.astype(np.float64)
        other = np.where(s > rd, np.nextafter(r, f32(np.inf)),
                         np.nextafter(r, f32(-np.inf)))
        od = other.astype(np.float64)
        mid = (rd + od) * 0.5                                # exact
    fix = (s == mid) & (s != rd) & (e != 0) & np.isfinite(s)
    if np.any(fix):
        lo = np.minimum(rd, od).astype(f32)
        hi = np.maximum(rd, od).astype(f32)
        r = np.where(fix, np.where(e > 0, hi, lo), r)
    return r


def ordered(x):
    i = np.asarray(x, f32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulp_diff(a, b):
    return np.abs(ordered(a) - ordered(b))


def read_fixture(path):
    with open(path, "rb") as f:
        buf = f.read()
    assert buf[:8] == b"DOSGOLD1", "bad magic"
    off = 8
    (ncases,) = struct.unpack_from("<I", buf, off)
    off += 4
    cases = []
    for _ in range(ncases):
        mode, n, steps, ncp = struct.unpack_from("<4I", buf, off)
        off += 16
        lr, b1, b2, eps, wd = struct.unpack_from("<5d", buf, off)
        off += 40
        cps = list(struct.unpack_from(f"<{ncp}I", buf, off))
        off += 4 * ncp

        def take(k):
            nonlocal off
            a = np.frombuffer(buf, "<f4", k, off).astype(f32)
            off += 4 * k
            return a
        p0 = take(n)
        grads = take(steps * n).reshape(steps, n)
        states = [(take(n), take(n), take(n)) for _ in cps]
        cases.append(dict(mode=mode, n=n, steps=steps, cps=cps, lr=lr, beta1=b1,
                          beta2=b2, eps=eps, wd=wd, p0=p0, grads=grads, states=states))
    assert off == len(buf), "trailing bytes"
    return cases


# ------------------------------------------------------------- the kernel
# Variant switches (value in WINNER = what torch 2.15.0/AVX512 does):
#   lerp:    'fma'   m = fma(w, g - m, m)             | 'nofma' m + w*(g - m)
#   l2:      'fma'   g = fma(p, wd, g)                | 'nofma' g + wd*p
#   addcmul: 'fma'   v = fma(omb2*g, g, v)            | 'nofma' v + (omb2*g)*g
#            'fma_gg' fma(omb2, g*g, v)               | 'gg'    v + omb2*(g*g)
#   div:     'div'   sqrt(v) / bc2s                   | 'recip' sqrt(v) * (1/bc2s)
#   addcdiv: 'vm_d'  p + (-ss*m)/denom                | 'v_md'  p + -ss*(m/denom)
#            'fma_v_md' fma(-ss, m/denom, p)
WINNER = dict(lerp="fma", l2="fma", addcmul="fma", div="div", addcdiv="vm_d")
BRIEF = dict(lerp="fma", l2="fma", addcmul="nofma", div="div", addcdiv="vm_d")


def step_scalars(lr, beta1, beta2, eps, wd, t):
    """Host-side scalars exactly as torch/optim/adam.py computes them (double),
    each rounded once to float32 by the ATen kernel (Scalar.to<float>())."""
    bc1 = 1 - beta1 ** float(t)
    bc2 = 1 - beta2 ** float(t)
    step_size = lr / bc1
    bc2_sqrt = bc2 ** 0.5            # adam.py uses **0.5 (C pow), not math.sqrt
    return dict(omb1=f32(1 - beta1), beta2=f32(beta2), omb2=f32(1 - beta2),
                bc2s=f32(bc2_sqrt), neg_ss=f32(-step_size), eps=f32(eps),
                decay=f32(1 - lr * wd), wd=f32(wd))


def replay(case, var, sqrt_fn):
    mode, wd = case["mode"], case["wd"]
    p = case["p0"].copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    out = []
    for s in range(case["steps"]):
        t = s + 1
        k = step_scalars(case["lr"], case["beta1"], case["beta2"], case["eps"], wd, t)
        g = case["grads"][s]
        if wd != 0:                                   # torch skips both when wd == 0
            if mode == 1:
                p = p * k["decay"]
            else:
                g = fma32(p, k["wd"], g) if var["l2"] == "fma" else g + k["wd"] * p
        d = g - m
        m = fma32(k["omb1"], d, m) if var["lerp"] == "fma" else m + k["omb1"] * d
        v = v * k["beta2"]
        if var["addcmul"] == "fma":
            v = fma32(k["omb2"] * g, g, v)
        elif var["addcmul"] == "nofma":
            v = v + (k["omb2"] * g) * g
        elif var["addcmul"] == "fma_gg":
            v = fma32(k["omb2"], g * g, v)
        else:
            v = v + k["omb2"] * (g * g)
        sq = sqrt_fn(v)
        den = sq / k["bc2s"] if var["div"] == "div" else sq * (f32(1) / k["bc2s"])
        den = den + k["eps"]
        if var["addcdiv"] == "vm_d":
            p = p + (k["neg_ss"] * m) / den
        elif var["addcdiv"] == "v_md":
            p = p + k["neg_ss"] * (m / den)
        else:
            p = fma32(k["neg_ss"], m / den, p)
        if t in case["cps"]:
            out.append((p.copy(), m.copy(), v.copy()))
    return out


def compare(case, res):
    """Per checkpoint (max ulp p, m, v) and per-region mismatch counts."""
    n = case["n"]
    body = n // VEC_BODY * VEC_BODY
    rows = []
    for (tp, tm, tv), (ep, em, ev) in zip(case["states"], res):
        dp, dm, dv = ulp_diff(tp, ep), ulp_diff(tm, em), ulp_diff(tv, ev)
        rows.append(dict(p=int(dp.max()), m=int(dm.max()), v=int(dv.max()),
                         p_abs=float(np.max(np.abs(tp.astype(np.float64) - ep))),
                         # |dp| in ulps of max(|p_torch|, 1): tolerance metric
                         p_ulp1=float(np.max(np.abs(tp.astype(np.float64) - ep)
                                             / np.spacing(np.maximum(np.abs(tp), f32(1))))),
                         p_body=int(np.count_nonzero(dp[:body])),
                         p_tail=int(np.count_nonzero(dp[body:])),
                         mv_body=int(np.count_nonzero(dm[:body]) + np.count_nonzero(dv[:body])),
                         mv_tail=int(np.count_nonzero(dm[body:]) + np.count_nonzero(dv[body:]))))
    return rows


def run_variant(cases, var, sqrt_fn):
    return [compare(c, replay(c, var, sqrt_fn)) for c in cases]


def summarize(rows):
    return (max(r["p"] for r in rows), max(r["m"] for r in rows), max(r["v"] for r in rows))


def selftest():
    import ctypes
    libm = ctypes.CDLL("libm.so.6")
    libm.fmaf.restype = ctypes.c_float
    libm.fmaf.argtypes = [ctypes.c_float] * 3
    rng = np.random.default_rng(1)
    N = 50000
    tests = {
        "random": ((rng.standard_normal(N) * np.exp(rng.uniform(-30, 30, N))).astype(f32),
                   (rng.standard_normal(N) * np.exp(rng.uniform(-30, 30, N))).astype(f32),
                   (rng.standard_normal(N) * np.exp(rng.uniform(-60, 60, N))).astype(f32)),
        # a*b exactly on a float32 midpoint, tiny c of either sign: the
        # double-rounding trap for the naive float64 emulation
        "midpoints": ((2 * rng.integers(1 << 22, 1 << 23, N) + 1).astype(f32),
                      np.full(N, 1.5, f32),
                      (rng.choice([-1, 1], N) * np.ldexp(1.0, rng.integers(-60, -2, N))).astype(f32)),
    }
    ok = True
    for name, (a, b, c) in tests.items():
        ref = np.array([libm.fmaf(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], f32)
        got = fma32(a, b, c)
        naive = (a.astype(np.float64) * b + c.astype(np.float64)).astype(f32)
        bad = int(np.count_nonzero(got.view(np.uint32) != ref.view(np.uint32)))
        nbad = int(np.count_nonzero(naive.view(np.uint32) != ref.view(np.uint32)))
        print(f"selftest {name}: fma32 mismatches {bad}/{N} (naive float64 emulation: {nbad})")
        ok &= bad == 0
    return ok


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(here, "adam_torch.bin"))
    ap.add_argument("--sqrt", choices=["ieee", "torch"], default="ieee")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()

    if args.selftest and not selftest():
        sys.exit(1)

    if args.sqrt == "torch":
        import torch
        torch.set_num_threads(1)
        sqrt_fn = lambda x: torch.from_numpy(np.ascontiguousarray(x, f32)).sqrt().numpy()
    else:
        sqrt_fn = np.sqrt

    cases = read_fixture(args.bin)

    # bias-correction sqrt: pow(x, 0.5) (what adam.py does) vs sqrt(x)
    diff = 0
    for c in cases:
        for t in range(1, c["steps"] + 1):
            x = 1 - c["beta2"] ** float(t)
            diff += f32(x ** 0.5) != f32(math.sqrt(x))
    print(f"bc2_sqrt: float32(pow(x,0.5)) != float32(sqrt(x)) in {diff} case-steps")

    def label(c):
        return (f"{'AdamW' if c['mode'] else 'Adam '} n={c['n']:<3} lr={c['lr']:<6g} "
                f"b=({c['beta1']:g},{c['beta2']:g}) eps={c['eps']:g} wd={c['wd']:g}")

    print(f"\n== WINNER {WINNER}  sqrt={args.sqrt}")
    win = run_variant(cases, WINNER, sqrt_fn)
    for ci, (c, rows) in enumerate(zip(cases, win)):
        mp, mm, mv = summarize(rows)
        last = rows[-1]
        tail = c["n"] % VEC_BODY
        pabs = max(r["p_abs"] for r in rows)
        pu1 = max(r["p_ulp1"] for r in rows)
        print(f"case {ci} {label(c)}: max ulp p={mp} m={mm} v={mv}"
              f" | max|dp|={pabs:.3g} = {pu1:g} ulp(max(|p|,1))"
              f" | last ckpt p mismatches body={last['p_body']} tail={last['p_tail']}/{tail}")
        if args.all:
            for cp, r in zip(c["cps"], rows):
                print(f"    step {cp:>2}: ulp p={r['p']} m={r['m']} v={r['v']}"
                      f"  p!=: body {r['p_body']} tail {r['p_tail']}")

    print(f"\n== variants, one switch changed from WINNER (sqrt={args.sqrt}); "
          "max ulp (p,m,v) per case")
    variants = [("BRIEF candidate (addcmul without FMA)", BRIEF)]
    alts = dict(lerp=["nofma"], l2=["nofma"], addcmul=["nofma", "fma_gg", "gg"],
                div=["recip"], addcdiv=["v_md", "fma_v_md"])
    for key, vals in alts.items():
        for val in vals:
            variants.append((f"{key}={val}", dict(WINNER, **{key: val})))
    for name, var in variants:
        res = run_variant(cases, var, sqrt_fn)
        print(f"{name:<40} " + " ".join(f"{summarize(r)}" for r in res))


if __name__ == "__main__":
    main()
