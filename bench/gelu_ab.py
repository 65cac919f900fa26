"""mathlib's erf and GELU's exact form in fused kernels, before and after the division-free erf
(docs/codegen.md, "A division-free erf (2026-12-07 late)"): accuracy over dense f32 sweeps and
the kernels' time, the candidates interleaved in one process, one thread.

"old" is the erf this round started from (Eigen's 13/8 rational below |x| = 0.5 and Numerical
Recipes' ``t exp(-x^2 + P(t))``, ``t = 1 / (1 + |x|/2)``, above: two divisions a lane), kept here
only to compare; "new" is mathlib's ``pt_erff``. Timed: ``gelu(x)`` over 2**16 and 2**20 f32,
and Swin's MLP shape ``gelu(x @ w + b)``, x [1024, 16], w [16, 64] (the GELU as the product's
epilogue), each compiled with the old and the new erf.

With ``--models convnext,vit,swin`` it also times each zoo model's whole frozen program (the
import path's) built with the old and the new erf, interleaved, thread CPU time, with each
one's largest error against eager. (The direct convolutions' GELU epilogue, ``conv.gelu_lines``,
has its own vector erf and is the same in both.)

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/gelu_ab.py [--rounds 15] [--calls 100] [--no-accuracy]
      [--models convnext,vit,poolformer,swin]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from typing import Callable, Iterator

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from partita.codegen import CompiledProgram, mathlib  # noqa: E402
from partita.ir import Builder, Graph, TensorType, verify  # noqa: E402
from partita.ir.dtypes import DTYPES  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_tanh import interleave, ulps  # noqa: E402  (the same ulp measure and interleaved timing)

OLD_ERF = """\
define internal float @pt_erff_small(float %x) alwaysinline {
  %lo = call float @llvm.maxnum.f32(float %x, float 0xC010000000000000)
  %xc = call float @llvm.minnum.f32(float %lo, float 0x4010000000000000)
  %x2 = fmul float %xc, %xc
  %na0 = call float @llvm.fma.f32(float 0xBDF2BBE160000000, float %x2, float 0x3E5DBFFDC0000000)
  %na1 = call float @llvm.fma.f32(float %na0, float %x2, float 0xBEC19FEA20000000)
  %na2 = call float @llvm.fma.f32(float %na1, float %x2, float 0xBF0DD85A40000000)
  %na3 = call float @llvm.fma.f32(float %na2, float %x2, float 0xBF48158C60000000)
  %na4 = call float @llvm.fma.f32(float %na3, float %x2, float 0xBF68343EC0000000)
  %na5 = call float @llvm.fma.f32(float %na4, float %x2, float 0xBF907B7A80000000)
  %p = fmul float %na5, %xc
  %da0 = call float @llvm.fma.f32(float 0xBEEE8C19A0000000, float %x2, float 0xBF2BF7A520000000)
  %da1 = call float @llvm.fma.f32(float %da0, float %x2, float 0xBF5B9249C0000000)
  %da2 = call float @llvm.fma.f32(float %da1, float %x2, float 0xBF7E337F00000000)
  %da3 = call float @llvm.fma.f32(float %da2, float %x2, float 0xBF8D36D4E0000000)
  %q = fdiv float %p, %da3
  %q1 = select i1 true, float %q, float %q
  %nan = fcmp uno float %x, 0.0
  %res = select i1 %nan, float %x, float %q1
  ret float %res
}

define internal float @pt_erff(float %x) alwaysinline {
  %s = call float @pt_erff_small(float %x)
  %a = call float @llvm.fabs.f32(float %x)
  %h = fmul float %a, 0.5
  %h1 = fadd float %h, 1.0
  %t = fdiv float 1.0, %h1
  %ca0 = call float @llvm.fma.f32(float 0x3FC5DF28A0000000, float %t, float 0xBFEA4F1240000000)
  %ca1 = call float @llvm.fma.f32(float %ca0, float %t, float 0x3FF7D0F600000000)
  %ca2 = call float @llvm.fma.f32(float %ca1, float %t, float 0xBFF229CBA0000000)
  %ca3 = call float @llvm.fma.f32(float %ca2, float %t, float 0x3FD1D8F980000000)
  %ca4 = call float @llvm.fma.f32(float %ca3, float %t, float 0xBFC7D84980000000)
  %ca5 = call float @llvm.fma.f32(float %ca4, float %t, float 0x3FB8C6D920000000)
  %ca6 = call float @llvm.fma.f32(float %ca5, float %t, float 0x3FD7F11F60000000)
  %ca7 = call float @llvm.fma.f32(float %ca6, float %t, float 0x3FF00018E0000000)
  %ca8 = call float @llvm.fma.f32(float %ca7, float %t, float 0xBFF43F89C0000000)
  %aa = fmul float %a, %a
  %na = fneg float %aa
  %ex = fadd float %na, %ca8
  %e = call float @pt_expf(float %ex)
  %erfc = fmul float %t, %e
  %one = fsub float 1.0, %erfc
  %neg = fcmp olt float %x, 0.0
  %mone = fneg float %one
  %big = select i1 %neg, float %mone, float %one
  %small_x = fcmp olt float %a, 0.5
  %r0 = select i1 %small_x, float %s, float %big
  %lin = fmul float %x, 0x3FF20DD760000000
  %tiny = fcmp olt float %a, 0x3F1A36E2E0000000
  %r = select i1 %tiny, float %lin, float %r0
  %nan = fcmp uno float %x, 0.0
  %res = select i1 %nan, float %x, float %r
  ret float %res
}
"""


@contextlib.contextmanager
def old_math() -> Iterator[None]:
    """Kernels lowered inside use the old erf."""
    saved = dict(mathlib.F32_FUNCTIONS)
    mathlib.F32_FUNCTIONS["pt_erff"] = OLD_ERF
    try:
        yield
    finally:
        mathlib.F32_FUNCTIONS.clear()
        mathlib.F32_FUNCTIONS.update(saved)


def gelu_graph(n: int, fn: str = "gelu") -> Graph:
    """``fn`` (gelu or erf) over n f32."""
    b = Builder()
    x = b.input("x", TensorType((n,), DTYPES["f32"]))
    y = b.emit("gelu", x, approximate="none") if fn == "gelu" else b.emit("erf", x)
    return verify(b.ret(y))


def linear_gelu_graph(m: int = 1024, k: int = 16, n: int = 64, gelu: bool = True) -> Graph:
    """Swin's MLP shape: gelu(x @ w + b), or without its GELU (the floor the epilogue adds to)."""
    b = Builder()
    x = b.input("x", TensorType((m, k), DTYPES["f32"]))
    w = b.input("w", TensorType((k, n), DTYPES["f32"]))
    bias = b.input("b", TensorType((n,), DTYPES["f32"]))
    y = b.emit("add", b.emit("matmul", x, w), bias)
    return verify(b.ret(b.emit("gelu", y, approximate="none") if gelu else y))


def compiled(g: Graph, inputs: list[torch.Tensor], old: bool) -> Callable[[], torch.Tensor]:
    """``g`` compiled now with the old or the new erf, as a call on ``inputs``."""
    with old_math() if old else contextlib.nullcontext():
        prog = CompiledProgram(g, min_ops=1)
        prog(inputs)
    return lambda: prog(inputs)[0]


def sweep() -> np.ndarray:
    """Random bit patterns and a dense grid over [-12, 12]."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2 ** 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([bits.view(np.float32), np.linspace(-12, 12, 1_000_001, dtype=np.float32)])


def accuracy() -> None:
    """Each candidate's worst erf ulp, 1 + erf's error near -1, and GELU's errors over [-12, 12]."""
    x = sweep()
    with np.errstate(all="ignore"):
        xd = x.astype(np.float64)
        erf64 = np.vectorize(math.erf, otypes=[np.float64])(xd)
    g = np.linspace(-12, 12, 1_000_001, dtype=np.float32)
    gd = g.astype(np.float64)
    gel64 = gd / 2 * np.vectorize(math.erfc, otypes=[np.float64])(-gd / math.sqrt(2))
    torch_gelu = torch.nn.functional.gelu(torch.from_numpy(g)).numpy()
    normal = np.abs(gel64) >= np.finfo(np.float32).tiny
    big = np.abs(gel64) > 1e-3
    print(f"torch gelu (f32): vs float64 max ulp where |gelu| > 1e-3 {ulps(torch_gelu[big], gel64[big]).max():.2f}, "
          f"where normal {ulps(torch_gelu[normal], gel64[normal]).max():.3g}")
    for old in (True, False):
        name = "old" if old else "new"
        e = compiled(gelu_graph(x.size, "erf"), [torch.from_numpy(x)], old)().numpy()
        fin = np.isfinite(erf64)
        assert np.array_equal(np.isnan(e), np.isnan(erf64)), name
        tail = (x < -0.5) & (x > -4)
        tail_err = np.abs(e[tail].astype(np.float64) - erf64[tail]).max() / 2 ** -24
        gl = compiled(gelu_graph(g.size), [torch.from_numpy(g)], old)().numpy()
        print(f"erf {name}: max ulp {ulps(e[fin], erf64[fin]).max():.2f}, 1 + erf's error (-4 < x < -0.5) "
              f"{tail_err:.2f} ulp of 1; gelu over [-12, 12]: max ulp where |gelu| > 1e-3 "
              f"{ulps(gl[big], gel64[big]).max():.2f}, where normal {ulps(gl[normal], gel64[normal]).max():.3g}, "
              f"vs torch max abs {np.abs(gl - torch_gelu).max():.2e}")


def timing(rounds: int, calls: int) -> None:
    """gelu over 2**16 and 2**20 f32 and the Swin-shaped linear + GELU, old against new."""
    torch.manual_seed(0)
    cases: list[tuple[str, Graph, list[torch.Tensor], int]] = []
    for n in (1 << 16, 1 << 20):
        cases.append((f"gelu over {n} f32", gelu_graph(n), [torch.randn(n) * 3], max(1, calls * 65536 // n)))
    cases.append(("linear [1024,16]x[16,64] + gelu", linear_gelu_graph(),
                  [torch.randn(1024, 16), torch.randn(16, 64) / 4, torch.randn(64)], calls))
    cases.append(("linear [1024,16]x[16,64] (no gelu)", linear_gelu_graph(gelu=False),
                  [torch.randn(1024, 16), torch.randn(16, 64) / 4, torch.randn(64)], calls))
    for what, g, inputs, n_calls in cases:
        cands = {"old": compiled(g, inputs, True), "new": compiled(g, inputs, False)}
        assert torch.allclose(cands["old"](), cands["new"](), rtol=1e-5, atol=1e-6), what
        med, ratio = interleave(cands, rounds, n_calls)
        print(f"{what}: old {med['old']:.1f} us, new {med['new']:.1f} us, new / old {ratio:.2f}")


def models(names: str, rounds: int, calls: int) -> None:
    """Each model's whole program, old against new erf."""
    import tempfile
    from pathlib import Path

    import partita

    import bench_zoo as Z
    import zoo_models as ZM

    for name in names.split(","):
        case = Z.Case(ZM.BY_NAME[name], Path(tempfile.mkdtemp()))
        with Z.quiet():
            g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
        weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
        args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
        want = case.eager()
        whole: dict[str, Callable[[], object]] = {}
        for which in ("old", "new"):
            with old_math() if which == "old" else contextlib.nullcontext():
                prog = CompiledProgram(g, freeze=True)
                with torch.inference_mode():
                    out = prog(args, weights)[0]
            err = float((out - want).abs().max() / want.abs().max())
            print(f"{name} {which}: largest error against eager {err:.1e}")
            whole[which] = (lambda p=prog: p(args, weights))
        with torch.inference_mode():
            med, ratio = interleave(whole, rounds, max(calls // 20, 5))
        print(f"  {name} whole program: old {med['old']:.0f} us, new {med['new']:.0f} us, new / old {ratio:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--models", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.no_accuracy:
        accuracy()
    timing(args.rounds, args.calls)
    if args.models:
        models(args.models, args.rounds, args.calls)


if __name__ == "__main__":
    main()
