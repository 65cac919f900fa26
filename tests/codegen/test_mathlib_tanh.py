"""mathlib's tanh (one division a lane) and GELU's tanh form as ``x / (1 + exp(-2u))`` in fused
kernels (partita/codegen/mathlib.py, partita/codegen/gelu_form.py): accuracy over dense f32
sweeps against float64 and torch, the limits (tiny, large, inf, NaN, the branch point at
|x| = 0.625), and the written-out form (HF's NewGELU) reaching the same kernel code."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram
from partita.codegen.fused_body import body_graph
from partita.codegen.gelu_form import ENV, spelled_gelu_to_op
from partita.codegen.lowering import lower
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES

NEAR = np.float32(0.625) + np.arange(-3000, 3000, dtype=np.float32) * np.float32(2 ** -24)
SPECIAL = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.9e-4, 4e-4, -4e-4, 1e-30, -1e-30, 9.0,
                    -9.0, 10.0, 44.0, -44.0, 88.8, -88.8, 1e19, -1e19, 1e30, -1e30, 3.4e38, -3.4e38], np.float32)


def sweep() -> np.ndarray:
    """A dense grid, random bit patterns, both sides of the branch point, special values."""
    rng = np.random.default_rng(11)
    bits = rng.integers(0, 2 ** 32, 1 << 19, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([np.linspace(-20, 20, 400_001, dtype=np.float32), bits.view(np.float32), NEAR, -NEAR,
                           SPECIAL])


def run(op: str, x: np.ndarray) -> np.ndarray:
    """``op`` (tanh or gelu_tanh) over x as one fused kernel."""
    b = Builder()
    xi = b.input("x", TensorType(x.shape, DTYPES["f32"]))
    y = b.emit("gelu", xi, approximate="tanh") if op == "gelu_tanh" else b.emit("tanh", xi)
    prog = CompiledProgram(verify(b.ret(y)), min_ops=1)
    assert [n.op for n in prog.graph.nodes] == ["fused"]
    return prog([torch.from_numpy(x)])[0].numpy()


def ulps(got: np.ndarray, ref64: np.ndarray) -> np.ndarray:
    return np.abs(got.astype(np.float64) - ref64) / np.spacing(np.abs(ref64.astype(np.float32))).astype(np.float64)


def test_tanh_over_a_dense_sweep():
    x = sweep()
    got = run("tanh", x)
    with np.errstate(all="ignore"):
        ref64 = np.tanh(x.astype(np.float64))
    assert np.array_equal(np.isnan(got), np.isnan(ref64))
    fin = ~np.isnan(ref64)
    assert ulps(got[fin], ref64[fin]).max() <= 4.0
    near = np.isin(np.abs(x), NEAR)
    assert ulps(got[near], ref64[near]).max() <= 2.0          # both sides of the branch point
    # 1 + tanh(x) near -1 (GELU's tanh form): within 1.5 ulp of 1 (1.38 measured)
    tail = (x < -0.625) & (x > -9)
    assert np.abs(got[tail].astype(np.float64) - ref64[tail]).max() <= 1.5 * 2 ** -24
    # tiny x is x itself, the signs of zero kept, +-1 beyond the exp's range
    tiny = np.abs(x) < 4e-4
    assert np.array_equal(got[tiny], x[tiny]) and np.array_equal(np.signbit(got[tiny]), np.signbit(x[tiny]))
    big = np.isfinite(x) & (np.abs(x) > 9.1)
    assert np.array_equal(got[big], np.sign(x[big]))
    assert run("tanh", np.array([np.inf, -np.inf], np.float32)).tolist() == [1.0, -1.0]


def test_tanh_agrees_with_torch():
    x = sweep()
    got = run("tanh", x)
    ref = torch.tanh(torch.from_numpy(x)).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.abs(got[ok] - ref[ok]).max() <= 2.5e-7


def test_gelu_tanh_form_over_a_dense_sweep():
    """x / (1 + exp(-2u)) against torch's gelu(approximate="tanh") (f32, ATen's order) and the
    formula in float64: within the f32 tolerance of the tests, closer to float64 than ATen."""
    x = sweep()
    got = run("gelu_tanh", x)
    ref = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    with np.errstate(all="ignore"):
        xd = x.astype(np.float64)
        ref64 = xd / (1.0 + np.exp(-2.0 * math.sqrt(2.0 / math.pi) * (xd + 0.044715 * xd ** 3)))
    assert np.array_equal(np.isnan(got), np.isnan(ref))      # -inf: -inf * 0 in ATen, -inf / inf here
    inf = np.isinf(ref) | np.isinf(got)
    assert np.array_equal(got[inf], ref[inf])
    fin = np.isfinite(ref) & ~inf
    assert np.allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-6)
    assert np.abs(got[fin] - ref[fin]).max() <= 5e-7
    # where |gelu| > 1e-3 a few ulp of the float64 formula (u's own rounding, amplified by |2u|)
    big = fin & (np.abs(ref64) > 1e-3)
    assert ulps(got[big], ref64[big]).max() <= 20
    # the negative tail, where ATen's 1 + tanh(u) keeps only the ulps of 1: relative error small
    tail = (x > -5.5) & (x < -3)
    assert (np.abs(got[tail] - ref64[tail]) / np.abs(ref64[tail])).max() < 2e-5
    # far in the negative tail exp(-2u) overflows: -0.0, as ATen gives
    far = np.array([-10.0, -44.0, -1e19, -3.4e38], np.float32)
    out = run("gelu_tanh", far)
    assert np.all(np.abs(out) < 1e-30) and np.all(np.signbit(out))


def newgelu_program(cube: str, after_linear: bool = False) -> tuple[CompiledProgram, torch.nn.Module, torch.Tensor]:
    """A linear layer and HF's NewGELU written out (the cube as pow or x * x * x), imported and
    compiled as the zoo's import path does. The GELU reads ``lin(x) * 2 + 1`` (so it runs in a
    fused kernel), or with ``after_linear`` the linear layer itself (so it runs in the linear's
    epilogue, after factored_gelu turned the chain into the one op)."""

    class NewGELU(torch.nn.Module):
        def forward(self, x):
            c = torch.pow(x, 3.0) if cube == "pow" else x * x * x
            return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * c)))

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(12, 37)
            self.act = NewGELU()

        def forward(self, x):
            if after_linear:
                return self.act(self.lin(x)) * 2.0 + 1.0
            return self.act(self.lin(x) * 2.0 + 1.0)

    torch.manual_seed(0)
    m = M().eval()
    x = torch.randn(7, 12) * 3
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce")
    return CompiledProgram(g, freeze=True), m, x


def fused_irs(prog: CompiledProgram) -> list[str]:
    return [lower(body_graph(n.attrs["body"]), "k").ir for n in prog.graph.nodes if n.op == "fused"]


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_written_out_gelu_runs_as_the_one_op(cube, monkeypatch):
    prog, m, x = newgelu_program(cube)
    irs = fused_irs(prog)
    assert irs and all("pt_tanhf" not in ir and "@pt_expf(" in ir for ir in irs)
    with torch.no_grad():
        ref = m(x)
    torch.testing.assert_close(prog([x])[0], ref, rtol=1e-5, atol=1e-6)
    monkeypatch.setenv(ENV, "0")                             # off: ATen's order, on mathlib's tanh
    assert all("pt_tanhf" in ir for ir in fused_irs(prog))


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_written_out_gelu_after_a_linear_is_its_epilogue(cube):
    prog, m, x = newgelu_program(cube, after_linear=True)
    assert [n.attrs.get("unary") for n in prog.graph.nodes if n.op == "linear_pointwise"] == ["gelu_tanh"]
    assert all("pt_tanhf" not in ir for ir in fused_irs(prog))
    with torch.no_grad():
        ref = m(x)
    torch.testing.assert_close(prog([x])[0], ref, rtol=1e-5, atol=1e-6)


def test_rewrite_leaves_other_bodies_and_shared_intermediates():
    b = Builder()
    x = b.input("x", TensorType((5, 3), DTYPES["f32"]))
    t = b.tanh(b.mul(x, b.full(shape=(), value=0.5, dtype=DTYPES["f32"])))
    body = verify(b.ret(b.add(t, x)))
    assert spelled_gelu_to_op(body) is body                  # a tanh that is no GELU: untouched
    b = Builder()
    x = b.input("x", TensorType((5, 3), DTYPES["f32"]))

    def c(v: float):
        return b.full(shape=(), value=v, dtype=DTYPES["f32"])

    th = b.tanh(b.mul(b.add(x, b.mul(b.mul(b.mul(x, x), x), c(0.044715))), c(math.sqrt(2 / math.pi))))
    gelu = b.mul(b.mul(x, c(0.5)), b.add(th, c(1.0)))
    body = verify(b.ret(gelu, th))                           # tanh also an output: kept
    out = spelled_gelu_to_op(body)
    assert out is not body and [n.op for n in out.nodes].count("gelu") == 1
    assert [n.op for n in body.nodes].count("gelu") == 0     # the cached body is not changed
    prog = CompiledProgram(body, min_ops=1)
    xs = torch.randn(5, 3) * 3
    g, t2 = prog([xs])
    torch.testing.assert_close(g, torch.nn.functional.gelu(xs, approximate="tanh"), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t2, torch.tanh(math.sqrt(2 / math.pi) * (xs + 0.044715 * xs ** 3)),
                               rtol=1e-5, atol=1e-6)
