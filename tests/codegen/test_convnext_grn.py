"""ConvNeXt v2's global response norm as one op and one generated kernel (partita/codegen/grn.py):
the kernel against the reference and torch on odd shapes (channel counts that are, and are not,
multiples of the vector width), the fuse-library rewrite of the chain as transformers writes it
with the reference before and after, what it leaves alone, the program's step, and bad operands."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partita.codegen import CompiledProgram
from partita.codegen.grn import PreparedGRN, grn_ir
from partita.ir import Builder, TensorType, verify
from partita.ir.diagnostics import TypeRuleError
from partita.ir.dtypes import DTYPES
from partita.ops.registry import OPS
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731

# [N, H, W, C]: C odd (one lane), below a vector, 3 vectors, 8 vectors; one pixel; odd H, W
_SHAPES = [(2, 3, 5, 37), (3, 7, 3, 24), (4, 8, 8, 64), (2, 4, 4, 128), (1, 1, 1, 1), (5, 1, 9, 16)]


@pytest.mark.parametrize("shape", _SHAPES)
def test_the_kernel_equals_the_reference_and_torch(shape):
    rng = np.random.default_rng(sum(shape))
    c = shape[3]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    gamma, beta = (rng.standard_normal((1, 1, 1, c)).astype(np.float32) for _ in range(2))
    want = OPS["grn"].reference([x, gamma, beta], {"eps": 1e-6})
    got = PreparedGRN(shape, 1e-6)(torch.from_numpy(x), torch.from_numpy(gamma), torch.from_numpy(beta))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    on_aten = OPS["grn"].torch([torch.from_numpy(a) for a in (x, gamma, beta)], {"eps": 1e-6})
    np.testing.assert_allclose(on_aten.numpy(), want, rtol=1e-5, atol=1e-5)


def test_the_kernel_reads_strided_inputs_and_takes_one_dim_gamma():
    x = torch.randn(3, 6, 6, 40).transpose(1, 2)       # not contiguous: copied first
    gamma, beta = torch.randn(40), torch.randn(40)
    got = PreparedGRN((3, 6, 6, 40), 1e-6)(x, gamma, beta)
    want = OPS["grn"].torch([x, gamma, beta], {"eps": 1e-6})
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert "<8 x float>" in grn_ir("k", 4, 40, 1e-6, lanes=16) and "<1 x float>" in grn_ir("k", 4, 37, 1e-6)


def _spelled(b, x, gamma, beta, eps=1e-6, swap=False):
    """GRN as transformers' ConvNextV2GRN reaches partita (linalg.vector_norm decomposed)."""
    g = b.sqrt(b.sum(b.mul(x, x), axes=(1, 2), keepdim=True))
    den = b.add(b.mean(g, axes=(3,), keepdim=True), b.full(shape=(), value=eps))
    k = b.div(g, den)
    xk = b.mul(k, x) if swap else b.mul(x, k)
    t = b.mul(xk, gamma) if swap else b.mul(gamma, xk)
    return b.add(x, b.add(t, beta)) if swap else b.add(b.add(t, beta), x)


@pytest.mark.parametrize("swap", [False, True])
def test_the_rewrite_takes_the_chain_and_keeps_its_meaning(swap):
    b = Builder()
    x = b.input("x", T(2, 5, 3, 24))
    gamma, beta = b.param("gamma", T(1, 1, 1, 24)), b.param("beta", T(1, 1, 1, 24))
    g = verify(b.ret(b.relu(_spelled(b, x, gamma, beta, swap=swap))))
    inputs = random_inputs(g, 3)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    assert [n.op for n in out.nodes] == ["grn", "relu"]
    after = run_reference(out, inputs)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-5)
    prog = CompiledProgram(g)
    step = next(st for st in prog.program.steps if st[7].op == "grn")
    assert getattr(step[0], "__qualname__", "").startswith("grn_kernel")
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})[0]
    np.testing.assert_allclose(got.numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_what_the_rewrite_leaves_alone():
    b = Builder()
    x = b.input("x", T(2, 4, 4, 8))
    gamma, beta = b.param("gamma", T(1, 1, 1, 8)), b.param("beta", T(1, 1, 1, 8))
    # the norm over other axes (H only), and an intermediate read elsewhere
    g1 = b.sqrt(b.sum(b.mul(x, x), axes=(1,), keepdim=True))
    y1 = b.add(b.mul(gamma, b.mul(x, b.div(g1, b.add(b.mean(g1, axes=(3,), keepdim=True),
                                                      b.full(shape=(), value=1e-6))))), beta)
    y2 = _spelled(b, x, gamma, beta)
    g = verify(b.ret(y1, y2, b.mean(x, axes=(1, 2), keepdim=True)))
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    assert [n.op for n in out.nodes].count("grn") == 1 and "sqrt" in [n.op for n in out.nodes]
    b = Builder()
    x = b.input("x", T(2, 4, 4, 8))
    gamma, beta = b.param("gamma", T(1, 1, 1, 8)), b.param("beta", T(1, 4, 1, 8))   # not per channel
    g = verify(b.ret(_spelled(b, x, gamma, beta)))
    assert "grn" not in [n.op for n in PassManager.parse("fuse-library,dce").run(g).nodes]


def test_bad_operands_get_clear_errors():
    b = Builder()
    x = b.input("x", T(2, 4, 4, 8))
    with pytest.raises(TypeRuleError, match="gamma is .* per channel"):
        b.grn(x, b.input("g", T(4, 8)), b.input("b", T(8)))
    with pytest.raises(TypeRuleError, match="channels-last"):
        b.grn(b.input("y", T(4, 8)), b.input("g2", T(8)), b.input("b2", T(8)))
    with pytest.raises(TypeRuleError, match="x.s dtype and its 8 channels"):
        b.grn(x, b.input("g3", T(7)), b.input("b3", T(8)))
