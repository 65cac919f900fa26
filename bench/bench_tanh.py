"""mathlib's tanh and GELU's tanh form in a fused kernel, before and after one division a lane
(docs/codegen.md, "tanh and GELU's tanh form"): accuracy over a dense f32 sweep and the
kernel's time, the candidates interleaved in one process.

"old" is the tanh this round started from (both branches each with its own division: the rational's
and ``2 / (exp(2|x|) + 1)``), kept here only to compare; "new" is mathlib's ``pt_tanhf``. For GELU,
"old" is ATen's order ``0.5 x (1 + tanh(u))`` on the old tanh and "new" the fused body's
``x / (1 + exp(-2u))`` (partita/codegen/gelu_form.py).

With ``--models gpt2,gemma2,gptj`` it also times each zoo model's ``fused`` steps that hold a
tanh (the import path's program; each body compiled old and new, called on random inputs of
its shapes) and the whole frozen program built with old and new math, interleaved, thread
CPU time, with each one's largest error against eager.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/bench_tanh.py [--n 65536] [--rounds 15] [--calls 200]
      [--models gpt2,gemma2,gptj] [--no-accuracy]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from typing import Callable, Iterator

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from partita.codegen import CompiledProgram, mathlib  # noqa: E402
from partita.ir import Builder, TensorType, verify  # noqa: E402
from partita.ir.dtypes import DTYPES  # noqa: E402

OLD_TANH = """\
define internal float @pt_tanhf_small_old(float %x) alwaysinline {
  %lo = call float @llvm.maxnum.f32(float %x, float 0xC01F9F09E0000000)
  %xc = call float @llvm.minnum.f32(float %lo, float 0x401F9F09E0000000)
  %x2 = fmul float %xc, %xc
  %na0 = call float @llvm.fma.f32(float 0xBCB3E4B800000000, float %x2, float 0x3D4C266FC0000000)
  %na1 = call float @llvm.fma.f32(float %na0, float %x2, float 0xBDD7A6FFE0000000)
  %na2 = call float @llvm.fma.f32(float %na1, float %x2, float 0x3E6B800820000000)
  %na3 = call float @llvm.fma.f32(float %na2, float %x2, float 0x3EEF286940000000)
  %na4 = call float @llvm.fma.f32(float %na3, float %x2, float 0x3F44E1BDA0000000)
  %na5 = call float @llvm.fma.f32(float %na4, float %x2, float 0x3F740B3B80000000)
  %p = fmul float %na5, %xc
  %da0 = call float @llvm.fma.f32(float 0x3EB41A7B00000000, float %x2, float 0x3F1F12BAC0000000)
  %da1 = call float @llvm.fma.f32(float %da0, float %x2, float 0x3F629540A0000000)
  %da2 = call float @llvm.fma.f32(float %da1, float %x2, float 0x3F740B3BA0000000)
  %q = fdiv float %p, %da2
  %ax = call float @llvm.fabs.f32(float %x)
  %tiny = fcmp olt float %ax, 0x3F3A36E2E0000000
  %q1 = select i1 %tiny, float %x, float %q
  %nan = fcmp uno float %x, 0.0
  %res = select i1 %nan, float %x, float %q1
  ret float %res
}

define internal float @pt_tanhf_old(float %x) alwaysinline {
  %s = call float @pt_tanhf_small_old(float %x)
  %ax = call float @llvm.fabs.f32(float %x)
  %a2 = fmul float %ax, 2.0
  %e = call float @pt_expf(float %a2)
  %e1 = fadd float %e, 1.0
  %q = fdiv float 2.0, %e1
  %t = fsub float 1.0, %q
  %big = fcmp oge float %ax, 0x3FE4000000000000
  %neg = fcmp olt float %x, 0.0
  %tn = fneg float %t
  %l = select i1 %neg, float %tn, float %t
  %r = select i1 %big, float %l, float %s
  ret float %r
}
"""


@contextlib.contextmanager
def old_math() -> Iterator[None]:
    """Kernels lowered inside use the old tanh, and GELU's tanh form through it (ATen's order)."""
    saved = dict(mathlib.F32_FUNCTIONS)
    env = os.environ.get("PARTITA_GELU_SIGMOID")
    mathlib.F32_FUNCTIONS["pt_tanhf"] = OLD_TANH.replace("@pt_tanhf_old(", "@pt_tanhf(")
    os.environ["PARTITA_GELU_SIGMOID"] = "0"
    try:
        yield
    finally:
        mathlib.F32_FUNCTIONS.clear()
        mathlib.F32_FUNCTIONS.update(saved)
        if env is None:
            os.environ.pop("PARTITA_GELU_SIGMOID", None)
        else:
            os.environ["PARTITA_GELU_SIGMOID"] = env


def program(fn: str, n: int, old: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """One fused kernel computing ``fn`` (tanh or gelu_tanh) over n f32, compiled now."""
    b = Builder()
    x = b.input("x", TensorType((n,), DTYPES["f32"]))
    y = b.emit("gelu", x, approximate="tanh") if fn == "gelu_tanh" else b.emit("tanh", x)
    g = verify(b.ret(y))
    with old_math() if old else contextlib.nullcontext():
        prog = CompiledProgram(g, min_ops=1)
        prog([torch.zeros(n)])
    return lambda t: prog([t])[0]


def sweep() -> np.ndarray:
    """Dense f32 values: a grid, random bit patterns, the branch point, tiny, large, inf, NaN."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2 ** 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    near = np.float32(0.625) + np.arange(-2000, 2000, dtype=np.float32) * np.float32(2 ** -24)
    return np.concatenate([np.linspace(-20, 20, 400_001, dtype=np.float32), bits.view(np.float32), near, -near,
                           np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 4e-4, -4e-4, 1e-30, 9.0,
                                     -9.0, 88.8, -88.8, 1e30, -1e30], np.float32)])


def ulps(got: np.ndarray, ref64: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the f32 spacing at ref (finite entries)."""
    ref = ref64.astype(np.float32)
    return np.abs(got.astype(np.float64) - ref64) / np.spacing(np.abs(ref)).astype(np.float64)


def accuracy() -> None:
    """Print each candidate's worst errors against float64 and torch."""
    x = sweep()
    t = torch.from_numpy(x)
    with np.errstate(all="ignore"):
        th64 = np.tanh(x.astype(np.float64))
        xd = x.astype(np.float64)
        gl64 = xd / (1 + np.exp(-2 * math.sqrt(2 / math.pi) * (xd + 0.044715 * xd ** 3)))
    ref_gelu = torch.nn.functional.gelu(t, approximate="tanh").numpy()
    big = np.isfinite(gl64) & np.isfinite(ref_gelu) & (np.abs(gl64) > 1e-3)
    print(f"gelu_tanh torch: vs float64 max ulp where |gelu| > 1e-3 {ulps(ref_gelu[big], gl64[big]).max():.2f}")
    for old in (True, False):
        name = "old" if old else "new"
        th = program("tanh", x.size, old)(t).numpy()
        fin = np.isfinite(th64)
        assert np.array_equal(np.isnan(th), np.isnan(th64)), name
        tail = (x < -0.625) & (x > -9)
        tail_err = np.abs(th[tail].astype(np.float64) - th64[tail]).max() / 2 ** -24
        print(f"tanh {name}: max ulp {ulps(th[fin], th64[fin]).max():.2f}, "
              f"max ulp near 0.625 {ulps(th[-4016:-16], th64[-4016:-16]).max():.2f}, "
              f"1 + tanh's error (-9 < x < -0.625) {tail_err:.2f} ulp of 1, "
              f"vs torch.tanh max abs {np.nanmax(np.abs(th - torch.tanh(t).numpy())):.2e}")
        gl = program("gelu_tanh", x.size, old)(t).numpy()
        ok = np.isfinite(gl64) & np.isfinite(ref_gelu)
        big = ok & (np.abs(gl64) > 1e-3)
        print(f"gelu_tanh {name}: vs torch max abs {np.abs(gl[ok] - ref_gelu[ok]).max():.2e} "
              f"(|x| < 20: {np.abs(gl[ok & (np.abs(x) < 20)] - ref_gelu[ok & (np.abs(x) < 20)]).max():.2e}), "
              f"vs float64 max ulp where |gelu| > 1e-3 {ulps(gl[big], gl64[big]).max():.2f}, "
              f"NaN where torch has NaN {np.array_equal(np.isnan(gl), np.isnan(ref_gelu))}")


def timing(n: int, rounds: int, calls: int) -> None:
    """Median per-call thread CPU time (us; the moments the machine gives the core to another
    process left out) of old and new, interleaved, and the median ratio new / old."""
    t = torch.randn(n) * 3
    for fn in ("tanh", "gelu_tanh"):
        cands = {"old": program(fn, n, True), "new": program(fn, n, False)}
        times: dict[str, list[float]] = {k: [] for k in cands}
        for _ in range(rounds):
            for k, f in cands.items():
                for _ in range(5):
                    f(t)
                t0 = time.thread_time()
                for _ in range(calls):
                    f(t)
                times[k].append((time.thread_time() - t0) / calls * 1e6)
        ratio = statistics.median(a / b for a, b in zip(times["new"], times["old"]))
        print(f"{fn} over {n} f32: old {statistics.median(times['old']):.1f} us, "
              f"new {statistics.median(times['new']):.1f} us, new / old {ratio:.2f}")


def interleave(cands: dict[str, Callable[[], object]], rounds: int, calls: int) -> tuple[dict[str, float], float]:
    """Median thread CPU time (us) per call of each candidate (old, new), and the median of the
    per-round ratios new / old."""
    times: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(rounds):
        for k, f in cands.items():
            for _ in range(3):
                f()
            t0 = time.thread_time()
            for _ in range(calls):
                f()
            times[k].append((time.thread_time() - t0) / calls * 1e6)
    ratio = statistics.median(a / b for a, b in zip(times["new"], times["old"]))
    return {k: statistics.median(v) for k, v in times.items()}, ratio


def models(names: str, rounds: int, calls: int) -> None:
    """Each model's tanh-bearing fused steps and whole program, old against new math."""
    import tempfile
    from pathlib import Path

    import partita
    from partita.codegen.fused_body import body_graph

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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
        steps: dict[str, dict[str, Callable[[], object]]] = {}
        for which in ("old", "new"):
            with old_math() if which == "old" else contextlib.nullcontext():
                prog = CompiledProgram(g, freeze=True)
                with torch.inference_mode():
                    out = prog(args, weights)[0]
                err = float((out - want).abs().max() / want.abs().max())
                print(f"{name} {which}: largest error against eager {err:.1e}")
                whole[which] = (lambda p=prog: p(args, weights))
                for n in prog.graph.nodes:
                    if n.op != "fused" or "tanh" not in n.attrs["body"]:
                        continue
                    body = body_graph(n.attrs["body"])
                    sub = CompiledProgram(body.clone(), min_ops=1)
                    xs = [torch.randn(tuple(v.type.shape)) * 2 for v in body.inputs]
                    sub(xs)
                    key = f"{[list(v.type.shape) for v in body.inputs]}"
                    steps.setdefault(key, {})[which] = (lambda p=sub, a=xs: p(a))
        with torch.inference_mode():
            for key, cands in steps.items():
                med, ratio = interleave(cands, rounds, calls)
                print(f"  {name} fused step with tanh, inputs {key}: old {med['old']:.1f} us, "
                      f"new {med['new']:.1f} us, new / old {ratio:.2f}")
            med, ratio = interleave(whole, rounds, max(calls // 20, 5))
            print(f"  {name} whole program: old {med['old']:.0f} us, new {med['new']:.0f} us, new / old {ratio:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--models", default="")
    a = ap.parse_args()
    torch.set_num_threads(1)
    if not a.no_accuracy:
        accuracy()
    timing(a.n, a.rounds, a.calls)
    if a.models:
        models(a.models, a.rounds, a.calls)


if __name__ == "__main__":
    main()
