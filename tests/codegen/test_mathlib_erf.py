"""mathlib's division-free erf (partita/codegen/mathlib.py, ``pt_erff``) and GELU's exact form
on it in fused kernels: accuracy over dense f32 sweeps against float64, both sides of the branch
point |x| = 0.921875, ``1 + erf`` near -1 (what GELU computes), the limits (tiny, denormal,
beyond the clamp, inf, NaN, signed zeros), and GELU and its gradient against torch.
bench/gelu_ab.py prints the same figures beside the erf this replaced."""

from __future__ import annotations

import math

import numpy as np
import torch

from partita.codegen import CompiledProgram
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES

SPLIT = np.float32(0.921875)
NEAR = SPLIT + np.arange(-3000, 3000, dtype=np.float32) * np.float32(2 ** -24)
SPECIAL = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-38, -1e-38, 1e-30, -1e-30, 1e-4, -1e-4,
                    3.92, -3.92, 3.925, -3.925, 3.93, 4.0, -4.0, 9.0, -9.0, 1e30, -1e30, 3.4e38, -3.4e38],
                   np.float32)


def sweep() -> np.ndarray:
    """A dense grid, random bit patterns, both sides of the branch point, special values."""
    rng = np.random.default_rng(13)
    bits = rng.integers(0, 2 ** 32, 1 << 19, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([np.linspace(-12, 12, 400_001, dtype=np.float32), bits.view(np.float32), NEAR, -NEAR,
                           SPECIAL])


def run(op: str, *xs: np.ndarray) -> np.ndarray:
    """``op`` (erf, gelu or gelu_grad) over xs as one fused kernel."""
    b = Builder()
    vs = [b.input(f"x{i}", TensorType(x.shape, DTYPES["f32"])) for i, x in enumerate(xs)]
    y = b.emit("gelu", vs[0], approximate="none") if op == "gelu" else b.emit(op, *vs)
    prog = CompiledProgram(verify(b.ret(y)), min_ops=1)
    assert [n.op for n in prog.graph.nodes] == ["fused"]
    return prog([torch.from_numpy(x) for x in xs])[0].numpy()


def ulps(got: np.ndarray, ref64: np.ndarray) -> np.ndarray:
    return np.abs(got.astype(np.float64) - ref64) / np.spacing(np.abs(ref64.astype(np.float32))).astype(np.float64)


def erf64(x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64))


def test_erf_over_a_dense_sweep():
    x = sweep()
    got = run("erf", x)
    ref64 = erf64(x)
    assert np.array_equal(np.isnan(got), np.isnan(ref64))
    fin = ~np.isnan(ref64)
    assert ulps(got[fin], ref64[fin]).max() <= 2.0                  # 1.19 measured
    near = np.isin(np.abs(x), NEAR)
    assert ulps(got[near], ref64[near]).max() <= 2.0                # both sides of the branch point
    # 1 + erf(x) near -1 (GELU's exact form): within 1.5 ulp of 1 (1.16 measured)
    tail = (x < -SPLIT) & (x > -4)
    assert np.abs(got[tail].astype(np.float64) - ref64[tail]).max() <= 1.5 * 2 ** -24
    # beyond the clamp erf is +-1, as it rounds; the signs of zero kept; tiny and denormal x
    big = ~np.isnan(x) & (np.abs(x) >= 3.925)
    assert np.array_equal(got[big], np.sign(x[big]))
    zero = x == 0
    assert np.array_equal(np.signbit(got[zero]), np.signbit(x[zero])) and not got[zero].any()
    tiny = ~np.isnan(x) & (np.abs(x) < 1e-30)
    assert ulps(got[tiny], ref64[tiny]).max() <= 1.5               # denormal results included (1.18)
    assert run("erf", np.array([np.inf, -np.inf, np.nan], np.float32))[:2].tolist() == [1.0, -1.0]


def test_gelu_against_float64_and_torch():
    """GELU = x/2 (1 + erf(x/sqrt 2)): the sum 1 + erf cancels for negative x, so its error is
    bounded by an ulp or so of 1 times |x|/2 there (as torch's f32 GELU, computed the same way)."""
    x = np.linspace(-12, 12, 1_000_001, dtype=np.float32)
    got = run("gelu", x)
    xd = x.astype(np.float64)
    ref64 = xd / 2 * np.vectorize(math.erfc, otypes=[np.float64])(-xd / math.sqrt(2))
    err = np.abs(got.astype(np.float64) - ref64)
    bound = 2 * np.spacing(np.abs(ref64.astype(np.float32))).astype(np.float64) + np.abs(xd) / 2 * 1.5 * 2 ** -24
    assert (err <= bound).all(), x[np.argmax(err / bound)]
    assert np.abs(got - torch.nn.functional.gelu(torch.from_numpy(x)).numpy()).max() <= 2e-6
    assert run("gelu", np.array([np.nan, np.inf, -np.inf], np.float32))[:2].tolist()[1] == np.inf


def test_gelu_grad_against_torch():
    rng = np.random.default_rng(5)
    x = np.concatenate([np.linspace(-10, 10, 200_001, dtype=np.float32), NEAR * np.float32(math.sqrt(2))])
    dy = rng.standard_normal(x.size).astype(np.float32)
    got = run("gelu_grad", dy, x)
    xt = torch.from_numpy(x).requires_grad_()
    torch.nn.functional.gelu(xt).backward(torch.from_numpy(dy))
    assert xt.grad is not None
    ref = xt.grad.numpy()
    assert np.abs(got - ref).max() <= 1e-6 + 1e-5 * np.abs(ref).max()


def test_gelu_vector_lines_in_a_direct_convolution(monkeypatch):
    """``mathlib.gelu_vector_lines`` as the direct convolution's GELU epilogue (in place of
    ``conv.gelu_lines``): the result against float64 GELU of the float64 convolution, outputs
    spread over [-12, 12] so both erf branches and the clamp are reached."""
    import torch.nn.functional as F

    from partita.codegen import conv as K
    from partita.codegen import mathlib

    monkeypatch.setattr(K, "gelu_lines", mathlib.gelu_vector_lines)
    monkeypatch.setattr(K, "_KERNELS", {})
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 7, 5, 3, generator=g).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(19, 7, 1, 1, generator=g) * 2.5
    b = torch.randn(19, generator=g)
    for lanes in (8, 16):
        pc = K.PreparedConv(tuple(x.shape), tuple(wt.shape), [1, 1], [0, 0], "gelu", False,
                            cfg=K.conv_configs(lanes)[0])
        y = pc(x, pc.pack(wt), b, None)
        pre = F.conv2d(x.double(), wt.double(), b.double())
        assert float(pre.abs().max()) > 4.0
        ref = F.gelu(pre)
        assert float((y.double() - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))
        yn = pc(torch.full_like(x, float("nan")), pc.pack(wt), b, None)
        assert torch.isnan(yn).all()
