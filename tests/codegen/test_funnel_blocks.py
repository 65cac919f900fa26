"""An in-place write into a view read back through the same view (codegen/funnel_blocks.py):
Funnel's ``positional_attn *= cls_mask`` after the relative shift, as functionalization writes
it, on odd shapes against the reference interpreter and torch; the reads the rewrite must leave
alone (more than was written, an index that is no iota)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partita.codegen import CompiledProgram
from partita.codegen.funnel_blocks import tidy_view_writes
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
I64 = DTYPES["i64"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731
PIPELINE = "canonicalize,fuse-library,fuse-kernels,cse,dce"


def _shift_and_mask(B: int, H: int, Q: int, K: int, shift: int = 1):
    """scores [B, H, R, Q] (R = K + Q) -> the relative shift's view (rows from ``shift``, seen
    as [B, H, Q, R - shift], its first K columns), masked in place (scattered back into each
    base) and read back through the same view."""
    R = K + Q   # the relative length before the shift
    b = Builder()
    s = b.input("s", T(B, H, R, Q))
    m = b.input("m", T(Q, K))
    v1 = b.slice(s, axis=2, start=shift)                           # [B, H, R - shift, Q]
    r = b.reshape(v1, shape=(B, H, Q, R - shift))
    v = b.slice(r, axis=3, end=K)                                  # [B, H, Q, K]
    new = b.mul(v, m)
    i3 = b.iota(shape=(B, H, Q, K), axis=3)
    r2 = b.scatter_elements(r, i3, new, axis=3)
    back = b.reshape(r2, shape=(B, H, R - shift, Q))
    i2 = b.add(b.iota(shape=(B, H, R - shift, Q), axis=2), b.full(shape=(), value=shift, dtype=I64))
    s2 = b.scatter_elements(s, i2, back, axis=2)
    out = b.slice(b.reshape(b.slice(s2, axis=2, start=shift), shape=(B, H, Q, R - shift)), axis=3, end=K)
    return verify(b.ret(b.add(out, b.full(shape=(), value=1.0))))


def _torch_shift_and_mask(inputs: dict, B: int, H: int, Q: int, K: int, shift: int = 1) -> np.ndarray:
    s = torch.from_numpy(inputs["s"]).double().clone()
    R = K + Q
    v = s[:, :, shift:].reshape(B, H, Q, R - shift)[..., :K]
    v *= torch.from_numpy(inputs["m"]).double()   # the model's in-place write, through the views
    return (s[:, :, shift:].reshape(B, H, Q, R - shift)[..., :K] + 1).numpy()


@pytest.mark.parametrize("B,H,Q,K,shift", [(4, 4, 8, 8, 1), (2, 3, 5, 7, 1), (1, 2, 3, 4, 2), (3, 1, 6, 5, 0)])
def test_the_read_back_is_the_values_written(B, H, Q, K, shift):
    g = _shift_and_mask(B, H, Q, K, shift)
    inputs = random_inputs(g, B + Q + K)
    before = run_reference(g, inputs)
    np.testing.assert_allclose(before[0], _torch_shift_and_mask(inputs, B, H, Q, K, shift), rtol=1e-6, atol=1e-6)
    assert tidy_view_writes(g) >= 1
    verify(g)
    ops = [n.op for n in g.nodes]
    # (shift 0: the whole-axis slices stay until canonicalize drops them, below)
    assert shift == 0 or "scatter_elements" not in ops, ops
    np.testing.assert_allclose(run_reference(g, inputs)[0], before[0], rtol=1e-6, atol=1e-6)
    out = verify(PassManager.parse(PIPELINE).run(_shift_and_mask(B, H, Q, K, shift)))
    assert "scatter_elements" not in [n.op for n in out.nodes]
    got = CompiledProgram(out, freeze=True)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-6, atol=1e-6)


def _scatter_then_slice(start: int, end: int, offset: int, idx_axis: int = 1):
    b = Builder()
    x = b.input("x", T(3, 9, 4))
    u = b.input("u", T(3, 5, 4))
    idx = b.add(b.iota(shape=(3, 5, 4), axis=idx_axis), b.full(shape=(), value=offset, dtype=I64))
    s = b.scatter_elements(x, idx, u, axis=1)
    return verify(b.ret(b.slice(s, axis=1, start=start, end=end)))


@pytest.mark.parametrize("start,end,offset,idx_axis", [
    (1, 7, 2, 1),    # reads a row not written
    (2, 6, 2, 1),    # reads fewer rows than written (the slice's type differs)
    (2, 7, 2, 2),    # the index runs along another axis: not a block of rows
])
def test_reads_that_are_not_the_values_written_stay(start, end, offset, idx_axis):
    g = _scatter_then_slice(start, end, offset, idx_axis)   # (axis 2's iota + 2: rows 2..5, valid)
    inputs = random_inputs(g, 3)
    before = run_reference(g, inputs)
    assert tidy_view_writes(g) == 0
    np.testing.assert_allclose(run_reference(g, inputs)[0], before[0])


def test_exact_rows_are_taken():
    g = _scatter_then_slice(2, 7, 2)
    inputs = random_inputs(g, 4)
    before = run_reference(g, inputs)
    assert tidy_view_writes(g) == 1
    np.testing.assert_allclose(run_reference(g, inputs)[0], before[0])
    np.testing.assert_allclose(before[0], inputs["u"])


@pytest.mark.parametrize("shape,axes,perm,out", [
    ((4, 7, 3, 5), (4,), (0, 2, 3, 1, 4), (12, 5, 7)),          # einsum's "bind,bjnd->bnij" operand
    ((2, 3, 5), (0, 3), (3, 2, 0, 1, 4), (5, 6)),
    ((3, 4), (1,), (2, 1, 0), (4, 3)),
])
def test_unit_axes_before_a_transpose_read_by_reshapes(shape, axes, perm, out):
    b = Builder()
    x = b.input("x", T(*shape))
    t = b.transpose(b.unsqueeze(b.mul(x, x), axes=axes), perm=perm)
    g = verify(b.ret(b.reshape(t, shape=out), b.reshape(t, shape=(-1,))))
    inputs = random_inputs(g, len(shape))
    before = run_reference(g, inputs)
    want = (torch.from_numpy(inputs["x"]) ** 2).unsqueeze(axes[0])
    if len(axes) > 1:
        want = want.unsqueeze(axes[1])
    np.testing.assert_allclose(before[0], want.permute(perm).reshape(out).numpy(), rtol=1e-6)
    assert tidy_view_writes(g) == 1
    verify(g)
    assert "unsqueeze" not in [n.op for n in g.nodes]
    for got, ref in zip(run_reference(g, inputs), before):
        np.testing.assert_allclose(got, ref)


def test_unit_axes_stay_where_the_transpose_is_read_otherwise():
    b = Builder()
    x = b.input("x", T(2, 3))
    t = b.transpose(b.unsqueeze(x, axes=(2,)), perm=(2, 1, 0))
    g = verify(b.ret(b.mul(t, t)))
    assert tidy_view_writes(g) == 0


def test_the_heads_transpose_stays_with_one_token():
    """reshape [B, T*H*E] -> [B, T, H, E] then the heads' transpose (0, 2, 1, 3) with T = 1
    moves unit axes only, but stays a transpose: the attention matchers read the heads' move
    from it (LeViT's last stage has one token). Another unit-axis transpose between reshapes
    becomes a reshape of the value before."""
    b = Builder()
    x = b.input("x", T(4, 16))
    t = b.transpose(b.reshape(x, shape=(4, 1, 2, 8)), perm=(0, 2, 1, 3))
    g = verify(b.ret(b.reshape(t, shape=(8, 1, 8))))
    assert tidy_view_writes(g) == 0
    assert [n.op for n in g.nodes].count("transpose") == 1
    b = Builder()
    x = b.input("x", T(16, 8, 8))
    t = b.transpose(b.reshape(x, shape=(4, 4, 8, 1, 8)), perm=(0, 1, 2, 4, 3))
    g = verify(b.ret(b.reshape(t, shape=(4, 4, 8, 8))))
    inputs = random_inputs(g, seed=0)
    want = run_reference(g, inputs)
    assert tidy_view_writes(g) == 1
    assert "transpose" not in [n.op for n in g.nodes]
    np.testing.assert_array_equal(run_reference(g, inputs)[0], want[0])
