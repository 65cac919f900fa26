"""Funnel's relative attention as the model is imported (einsum's ``bnij`` lowering: a batched
``matmul`` whose result has its unit axis moved by a transpose, the content, position and
token-type scores summed and the padding term subtracted, the softmax unsqueezed before the
product with v, the product written to [B, H, T, 1, E]) taken into one ``attention`` node whose
mask is the terms' signed sum (codegen/funnel_blocks.py makes the unit-axis moves reshapes,
codegen/attention_spelled.py matches the attention). Odd shapes; the reference interpreter
before and after, the compiled program against it and torch; a transpose moving a non-unit
axis stays."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partita.codegen import CompiledProgram
from partita.codegen.attention_spelled import fuse_spelled_attention
from partita.codegen.funnel_blocks import tidy_view_writes
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731


def _funnel_attention(B: int, H: int, Tq: int, S: int, E: int):
    """content (q k^T through einsum's unit axis) + pos + tt - pad, softmax, times v, as
    [B, T, H * E]."""
    b = Builder()
    q = b.input("q", T(B, Tq, H, E))
    k, v = b.input("k", T(B, S, H, E)), b.input("v", T(B, S, H, E))
    pos, tt, pad = b.input("pos", T(B, H, Tq, S)), b.input("tt", T(B, H, Tq, S)), b.input("pad", T(B, 1, 1, S))
    q3 = b.reshape(b.transpose(q, perm=(0, 2, 1, 3)), shape=(B * H, Tq, E))
    kt = b.reshape(b.transpose(k, perm=(0, 2, 3, 1)), shape=(B * H, E, S))
    c5 = b.transpose(b.reshape(b.matmul(q3, kt), shape=(B, H, Tq, 1, S)), perm=(0, 1, 2, 4, 3))
    c = b.reshape(c5, shape=(B, H, Tq, S))
    s = b.sub(b.add(b.add(c, pos), tt), pad)
    p3 = b.reshape(b.unsqueeze(b.softmax(s), axes=[4]), shape=(B * H, Tq, S))
    v3 = b.reshape(b.transpose(v, perm=(0, 2, 1, 3)), shape=(B * H, S, E))
    o5 = b.reshape(b.matmul(p3, v3), shape=(B, H, Tq, 1, E))
    o = b.reshape(b.transpose(o5, perm=(0, 2, 1, 4, 3)), shape=(B, Tq, H * E))
    return verify(b.ret(o))


def _torch_funnel(inputs: dict) -> np.ndarray:
    """The same attention in torch (float64), as the model writes it."""
    x = {k: torch.from_numpy(v).double() for k, v in inputs.items()}
    s = torch.einsum("bind,bjnd->bnij", x["q"], x["k"]) + x["pos"] + x["tt"] - x["pad"]
    o = torch.einsum("bnij,bjnd->bind", torch.softmax(s, -1), x["v"])
    return o.reshape(o.shape[0], o.shape[1], -1).numpy()


def _rewrite(g):
    """tidy_view_writes, fuse_spelled_attention on each softmax, dce."""
    tidy_view_writes(g)
    for n in [n for n in g.nodes if n.op == "softmax"]:
        fuse_spelled_attention(g, n)
    return verify(PassManager.parse("dce").run(g))


@pytest.mark.parametrize("B,H,Tq,S,E", [(4, 4, 8, 8, 16), (2, 3, 5, 7, 12), (1, 2, 4, 8, 8), (3, 2, 6, 5, 4)])
def test_funnel_attention_becomes_one_node(B, H, Tq, S, E):
    g = _funnel_attention(B, H, Tq, S, E)
    inputs = random_inputs(g, B + H + Tq)
    inputs["pad"] = (np.random.default_rng(S).random((B, 1, 1, S)) > 0.7).astype(np.float32) * 1e6
    before = run_reference(g, inputs)
    np.testing.assert_allclose(before[0], _torch_funnel(inputs), rtol=1e-5, atol=1e-5)
    out = _rewrite(g)
    ops = [n.op for n in out.nodes]
    assert ops.count("attention") == 1 and "softmax" not in ops and "matmul" not in ops, ops
    att = next(n for n in out.nodes if n.op == "attention")
    assert att.attrs["scale"] == 1.0 and len(att.operands) == 4
    after = run_reference(out, inputs)
    np.testing.assert_allclose(after[0], before[0], rtol=1e-5, atol=1e-5)
    got = CompiledProgram(out)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("B,H,Tq,S,E", [(2, 3, 5, 7, 12), (3, 1, 6, 5, 4)])   # H = 1: left spelled out
def test_the_whole_pipeline_keeps_the_meaning(B, H, Tq, S, E):
    g = _funnel_attention(B, H, Tq, S, E)
    inputs = random_inputs(g, 3)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("canonicalize,fuse-library,fuse-kernels,cse,dce").run(g))
    got = CompiledProgram(out)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_a_transpose_moving_other_axes_stays():
    b = Builder()
    x = b.input("x", T(6, 4))
    y = b.transpose(b.reshape(x, shape=(2, 3, 1, 4)), perm=(1, 0, 3, 2))   # moves 2 and 3: a copy
    g = verify(b.ret(b.reshape(y, shape=(3, 8))))
    inputs = random_inputs(g, 1)
    before = run_reference(g, inputs)
    assert tidy_view_writes(g) == 0
    assert "transpose" in [n.op for n in g.nodes]
    np.testing.assert_allclose(run_reference(g, inputs)[0], before[0])


def test_unit_axis_moves_and_unsqueezes_become_reshapes():
    b = Builder()
    x = b.input("x", T(6, 4))
    # only the unit axis moves (the heads' (0, 2, 1, 3) stays a transpose: test_funnel_blocks)
    y = b.transpose(b.reshape(x, shape=(2, 3, 4, 1)), perm=(0, 1, 3, 2))
    z = b.reshape(b.unsqueeze(b.reshape(y, shape=(6, 4)), axes=[2]), shape=(24,))
    g = verify(b.ret(z))
    inputs = random_inputs(g, 2)
    before = run_reference(g, inputs)
    assert tidy_view_writes(g) >= 2
    g = verify(PassManager.parse("dce").run(g))
    assert {n.op for n in g.nodes} <= {"reshape"}, [n.op for n in g.nodes]
    np.testing.assert_allclose(run_reference(g, inputs)[0], before[0])
