#!/usr/bin/env python3
"""Generate PyTorch golden vectors for the starpu-dos Adam / AdamW kernel.

Reference: torch.optim.Adam / torch.optim.AdamW, float32, CPU, single-tensor
path (foreach=False, fused=False, capturable=False, differentiable=False,
amsgrad=False, maximize=False), one thread.

Output (next to this script unless --out-dir is given):
  adam_torch.bin  little-endian fixture, layout:
      char[8]  magic "DOSGOLD1"
      u32      n_cases
      per case:
        u32 mode (0 = Adam, L2 weight decay; 1 = AdamW, decoupled)
        u32 n, u32 steps, u32 n_checkpoints
        f64 lr, beta1, beta2, eps, weight_decay
        u32 checkpoint_steps[n_checkpoints]     (1-based step numbers)
        f32 p0[n]
        f32 grads[steps][n]
        per checkpoint: f32 p[n], f32 m[n], f32 v[n]   (state after that step)
  adam_torch.txt  human-readable metadata (versions, CPU capability, cases).

Usage:  python gen_adam_golden.py [--out-dir DIR]
Requires the exact versions in requirements.txt (checked at start-up unless
--allow-other-versions is given).
"""
import argparse
import datetime
import os
import platform
import struct
import sys

import numpy as np

TORCH_VERSION = "2.15.0"   # pinned; see requirements.txt
NUMPY_VERSION = "2.4.6"

MAGIC = b"DOSGOLD1"
STEPS = 50
CHECKPOINTS = [1, 2, 3, 5, 10, 20, 35, 50]
MASTER_SEED = 20240611

# Vector body of torch's cpu_kernel_vec on AVX512 is 2 * 16 = 32 floats per
# iteration; elements past the last multiple of 32 go through the scalar
# lambda (basic_loop). n % 32 == 0 -> no scalar tail.
# (mode, n, lr, beta1, beta2, eps, weight_decay)
CASES = [
    (1, 320, 1e-3, 0.9, 0.999, 1e-8, 0.01),
    (1, 288, 1e-2, 0.9, 0.95, 1e-8, 0.1),
    (1, 301, 0.1, 0.8, 0.99, 1e-6, 0.01),   # odd n: 9*32 body + 13 scalar tail
    (1, 256, 1e-3, 0.9, 0.999, 1e-8, 0.0),
    (0, 320, 1e-3, 0.9, 0.999, 1e-8, 0.0),
    (0, 288, 1e-2, 0.9, 0.95, 1e-6, 0.01),
    (0, 320, 0.1, 0.8, 0.99, 1e-8, 0.1),
    (0, 303, 1e-2, 0.8, 0.99, 1e-6, 0.01),  # odd n: 9*32 body + 15 scalar tail
]
MODE_NAME = {0: "Adam(L2)", 1: "AdamW"}


def make_case_data(case_idx, n):
    """Initial params and per-step gradients (float32, all finite)."""
    rng = np.random.default_rng([MASTER_SEED, case_idx])
    p0 = rng.standard_normal(n).astype(np.float32)
    grads = np.empty((STEPS, n), dtype=np.float32)
    for s in range(STEPS):
        # per-element magnitude spanning 1e-6 .. 1e2
        scale = 10.0 ** rng.uniform(-6.0, 2.0, n)
        g = rng.standard_normal(n) * scale
        # a few exact zeros (+0.0) each step
        zero_idx = rng.choice(n, size=3, replace=False)
        g[zero_idx] = 0.0
        grads[s] = g.astype(np.float32)
    # every few steps, zero a whole element's gradient for a few consecutive
    # steps (exercises m/v decay with g == 0)
    grads[10:13, 5] = 0.0
    assert np.all(np.isfinite(grads))
    return p0, grads


def run_torch_case(torch, mode, p0, grads, lr, beta1, beta2, eps, wd):
    param = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    kw = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd,
              amsgrad=False, maximize=False, foreach=False, fused=False,
              capturable=False, differentiable=False)
    opt = (torch.optim.AdamW if mode == 1 else torch.optim.Adam)([param], **kw)
    out = []
    for s in range(STEPS):
        param.grad = torch.from_numpy(grads[s].copy())
        opt.step()
        if (s + 1) in CHECKPOINTS:
            st = opt.state[param]
            out.append((param.detach().numpy().copy(),
                        st["exp_avg"].numpy().copy(),
                        st["exp_avg_sq"].numpy().copy()))
    assert float(opt.state[param]["step"]) == STEPS
    return out


def sqrt_rounding_census(torch, arrays):
    """How many torch.sqrt results differ from the correctly rounded sqrt."""
    tot = bad = 0
    for a in arrays:
        t = torch.from_numpy(a.copy()).sqrt().numpy()
        cr = np.sqrt(a)  # numpy float32 sqrt is correctly rounded (IEEE)
        tot += a.size
        bad += int(np.count_nonzero(t.view(np.uint32) != cr.view(np.uint32)))
    return bad, tot


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--allow-other-versions", action="store_true")
    args = ap.parse_args()

    import torch

    tv = torch.__version__.split("+")[0]
    if not args.allow_other_versions:
        if tv != TORCH_VERSION or np.__version__ != NUMPY_VERSION:
            sys.exit(f"need torch=={TORCH_VERSION} numpy=={NUMPY_VERSION}, have "
                     f"torch {torch.__version__} numpy {np.__version__} "
                     f"(or pass --allow-other-versions)")
    torch.set_num_threads(1)
    torch.manual_seed(MASTER_SEED)
    torch.use_deterministic_algorithms(True)
    cap = torch.backends.cpu.get_cpu_capability()

    blob = bytearray(MAGIC)
    blob += struct.pack("<I", len(CASES))
    table = []
    v_states = []
    for ci, (mode, n, lr, b1, b2, eps, wd) in enumerate(CASES):
        p0, grads = make_case_data(ci, n)
        res = run_torch_case(torch, mode, p0, grads, lr, b1, b2, eps, wd)
        blob += struct.pack("<4I", mode, n, STEPS, len(CHECKPOINTS))
        blob += struct.pack("<5d", lr, b1, b2, eps, wd)
        blob += struct.pack(f"<{len(CHECKPOINTS)}I", *CHECKPOINTS)
        blob += p0.astype("<f4").tobytes()
        blob += grads.astype("<f4").tobytes()
        for p, m, v in res:
            blob += p.astype("<f4").tobytes()
            blob += m.astype("<f4").tobytes()
            blob += v.astype("<f4").tobytes()
            v_states.append(v)
        table.append((ci, MODE_NAME[mode], n, n // 32 * 32, n % 32, lr, b1, b2, eps, wd))

    bin_path = os.path.join(args.out_dir, "adam_torch.bin")
    with open(bin_path, "wb") as f:
        f.write(bytes(blob))

    sq_bad, sq_tot = sqrt_rounding_census(torch, v_states)
    cpu_model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mkl_line = next((l.strip() for l in torch.__config__.show().splitlines()
                     if "Math Kernel Library" in l), "MKL: not reported")

    lines = [
        "starpu-dos Adam/AdamW golden vectors (adam_torch.bin)",
        f"generated_utc: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')}",
        f"generator: gen_adam_golden.py (seed {MASTER_SEED})",
        f"torch: {torch.__version__}",
        f"aten_cpu_capability: {cap}",
        f"numpy: {np.__version__}",
        f"python: {platform.python_version()}",
        f"cpu: {cpu_model}",
        f"mkl: {mkl_line.lstrip('- ')}",
        f"torch_threads: {torch.get_num_threads()}",
        "reference: torch.optim.{Adam,AdamW} fp32 CPU single-tensor path "
        "(foreach=False fused=False capturable=False differentiable=False amsgrad=False maximize=False)",
        f"bin_bytes: {len(blob)}",
        f"steps: {STEPS}  checkpoints: {','.join(map(str, CHECKPOINTS))}",
        "grads: normal * 10**U(-6,2) per element, 3 exact zeros per step, grads[10:13,5]=0; p0: normal",
        f"torch.sqrt census on checkpoint v states: {sq_bad}/{sq_tot} results differ "
        "from correctly rounded sqrtf (torch fp32 sqrt = MKL vmsSqrt VML_HA, not IEEE-exact)",
        "vector body = n//32*32 elements (AVX512: 2x16 floats per iteration), scalar tail = n%32;",
        "  the scalar tail was measured to perform the same float32 operations (incl. FMAs) as the body",
        "per-element sequence reproducing torch bit-exactly (check_formula.py WINNER, with torch.sqrt):",
        "  scalars (double, then one rounding to f32): omb1=1-b1, b2, omb2=1-b2, bc2s=(1-b2**t)**0.5,",
        "    nss=-(lr/(1-b1**t)), eps, decay=1-lr*wd, wd",
        "  AdamW (wd!=0): p=p*decay | Adam (wd!=0): g=fmaf(p,wd,g) | wd==0: neither",
        "  m=fmaf(omb1,g-m,m); v=v*b2; v=fmaf(omb2*g,g,v); d=sqrt(v)/bc2s+eps; p=p+(nss*m)/d",
        "",
        "case mode      n   body tail  lr       beta1 beta2  eps      weight_decay",
    ]
    for ci, mname, n, body, tail, lr, b1, b2, eps, wd in table:
        lines.append(f"{ci:<4} {mname:<9} {n:<3} {body:<4} {tail:<4} {lr:<8g} {b1:<5g} {b2:<6g} {eps:<8g} {wd:g}")
    with open(os.path.join(args.out_dir, "adam_torch.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
