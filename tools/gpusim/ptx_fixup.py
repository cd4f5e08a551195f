#!/usr/bin/env python3
"""Rewrites, in place, the PTX forms that GPGPU-Sim cannot run into exact equivalents it
can (tools/gpusim.sh calls this on each PTX file the simulator extracts):

- copysign.f32 d, a, b (the magnitude of b with the sign of a): the simulator has no
  copysign; the same bits come from integer and/or on two scratch registers.
- shfl.sync.MODE.b32 d|p, ...: the simulator writes the shuffled value into the predicate
  p and leaves d unchanged; when p is read nowhere else in the function, d alone is asked
  for. When p is used, the instruction is left as it is and a line says so on stderr (its
  kernel would compute garbage under the simulator: a test would show it).

usage: ptx_fixup.py FILE.ptx"""
import re
import sys

COPYSIGN = re.compile(r"^(\s*)copysign\.f32\s+(%\w+),\s*(%\w+),\s*(%\w+);", re.M)
SHFL_PRED = re.compile(r"(shfl\.sync\.\w+\.b32\s+)(%\w+)\|(%\w+),")
FUNCTION_START = re.compile(r"^(?=(?:\.visible\s+|\.weak\s+)?\.(?:entry|func)\b)", re.M)
FIRST_REG_DECL = re.compile(r"^(\s*\.reg [^\n]*)$", re.M)


def rewrite_copysign(body):
    """One function's copysigns, with its two scratch registers declared."""

    def one(m):
        ind, d, a, b = m.groups()
        return "\n".join(
            [
                f"{ind}mov.b32 %dos_cs0, {a};",
                f"{ind}and.b32 %dos_cs0, %dos_cs0, 0x80000000;",
                f"{ind}mov.b32 %dos_cs1, {b};",
                f"{ind}and.b32 %dos_cs1, %dos_cs1, 0x7FFFFFFF;",
                f"{ind}or.b32 %dos_cs1, %dos_cs1, %dos_cs0;",
                f"{ind}mov.b32 {d}, %dos_cs1;",
            ]
        )

    body, count = COPYSIGN.subn(one, body)
    if count:
        body = FIRST_REG_DECL.sub(lambda m: m.group(1) + "\n\t.reg .b32 %dos_cs<2>;", body, count=1)
    return body, count


def rewrite_shfl(body):
    """One function's shfl predicate outputs that nothing reads."""
    dropped = kept = 0

    def one(m):
        nonlocal dropped, kept
        if len(re.findall(re.escape(m.group(3)) + r"\b", body)) == 1:
            dropped += 1
            return m.group(1) + m.group(2) + ","
        kept += 1
        return m.group(0)

    return SHFL_PRED.sub(one, body), dropped, kept


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    with open(path) as f:
        ptx = f.read()
    copysigns = dropped = kept = 0
    functions = FUNCTION_START.split(ptx)
    for i, body in enumerate(functions):
        body, c = rewrite_copysign(body)
        body, d, k = rewrite_shfl(body)
        functions[i] = body
        copysigns, dropped, kept = copysigns + c, dropped + d, kept + k
    ptx = "".join(functions)
    with open(path, "w") as f:
        f.write(ptx)
    if copysigns or dropped or kept:
        sys.stderr.write(
            f"ptx_fixup: {path}: {copysigns} copysign.f32 rewritten, "
            f"{dropped} shfl predicate outputs dropped\n"
        )
    if kept:
        sys.stderr.write(f"ptx_fixup: {path}: {kept} shfl with a used predicate output left as is\n")


if __name__ == "__main__":
    main()
