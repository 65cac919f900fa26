"""Chains of row moves as one gather of rows (codegen/row_gather.py): Swin's shifted windows
(roll by two constant index_selects, window partition by reshape/transpose/reshape, and back)
on odd shapes against the reference interpreter and the compiled program; chains that are not
row moves, or not worth one gather, left alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partita.codegen import CompiledProgram
from partita.codegen.row_gather import fold_row_gathers, row_chain
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731


def _roll_index(n: int, shift: int) -> np.ndarray:
    """torch.roll(x, -shift) along one axis of n as an index."""
    return (np.arange(n, dtype=np.int64) + shift) % n


def _shifted_windows(B: int, H: int, W: int, C: int, ws: int, shift: int):
    """Roll by ``shift`` on H and W, cut into ws x ws windows, a row-wise op, windows put back,
    rolled back, a row-wise op (Swin's shifted block without its attention)."""
    b = Builder()
    x = b.input("x", T(B, H * W, C))
    g = b.reshape(x, shape=(B, H, W, C))
    g = b.index_select(g, b.constant(value=_roll_index(H, shift)), axis=1)
    g = b.index_select(g, b.constant(value=_roll_index(W, shift)), axis=2)
    g = b.reshape(g, shape=(B, H // ws, ws, W // ws, ws, C))
    g = b.transpose(g, perm=(0, 1, 3, 2, 4, 5))
    g = b.reshape(g, shape=(B * (H // ws) * (W // ws) * ws * ws, C))
    g = b.neg(g)
    g = b.reshape(g, shape=(B, H // ws, W // ws, ws, ws, C))
    g = b.transpose(g, perm=(0, 1, 3, 2, 4, 5))
    g = b.reshape(g, shape=(B, H, W, C))
    g = b.index_select(g, b.constant(value=_roll_index(H, -shift)), axis=1)
    g = b.index_select(g, b.constant(value=_roll_index(W, -shift)), axis=2)
    return verify(b.ret(b.neg(b.reshape(g, shape=(B, H * W, C)))))


@pytest.mark.parametrize("B,H,W,C,ws,shift", [(2, 6, 9, 5, 3, 1), (1, 4, 4, 7, 2, 1), (3, 10, 5, 3, 5, 2), (4, 16, 16, 16, 4, 2)])
def test_shifted_windows_one_gather_each_way(B, H, W, C, ws, shift):
    g = _shifted_windows(B, H, W, C, ws, shift)
    inputs = random_inputs(g, B + H + W)
    before = run_reference(g, inputs)
    assert fold_row_gathers(g) == 2
    verify(g)
    ops = [n.op for n in g.nodes]
    assert ops.count("embedding") == 2 and "index_select" not in ops and "transpose" not in ops, ops
    np.testing.assert_array_equal(run_reference(g, inputs)[0], before[0])
    got = CompiledProgram(g)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_array_equal(got[0].numpy(), before[0])


def test_slices_and_index_select_of_rows():
    """A strided slice, an index_select with repeats and a transpose of the leading axes."""
    b = Builder()
    x = b.input("x", T(3, 7, 5, 4))
    g = b.slice(x, axis=1, start=1, end=-1, step=2)
    g = b.index_select(g, b.constant(value=np.array([4, 0, 0, 2], dtype=np.int64)), axis=2)
    g = b.transpose(g, perm=(2, 0, 1, 3))
    g = verify(b.ret(b.neg(b.reshape(g, shape=(-1, 4)))))
    inputs = random_inputs(g, 5)
    before = run_reference(g, inputs)
    assert fold_row_gathers(g) == 1
    verify(g)
    np.testing.assert_array_equal(run_reference(g, inputs)[0], before[0])


def test_moves_within_a_row_or_one_copy_left_alone():
    b = Builder()
    x = b.input("x", T(4, 6, 5))
    idx = b.constant(value=np.array([5, 4, 3, 2, 1, 0], dtype=np.int64))
    lone = b.index_select(x, idx, axis=1)                       # one copy: nothing to save
    inner = b.transpose(b.index_select(x, idx, axis=1), perm=(0, 2, 1))   # moves inside rows
    last = b.index_select(b.transpose(x, perm=(1, 0, 2)),
                          b.constant(value=np.array([4, 3, 2, 1, 0], dtype=np.int64)), axis=2)  # the channels
    g = verify(b.ret(b.neg(lone), b.neg(inner), b.neg(last)))
    assert fold_row_gathers(g) == 0
    assert all(row_chain(n) is None for n in g.nodes)


def test_swin_block_through_the_import_pipeline():
    """The same block through fuse-library (where the rewrite runs) and compiled."""
    g = _shifted_windows(2, 8, 8, 6, 4, 2)
    inputs = random_inputs(g, 3)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce").run(g))
    ops = [n.op for n in out.nodes]
    assert "index_select" not in ops, ops
    got = CompiledProgram(out, freeze=True)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_array_equal(got[0].numpy(), before[0])


@pytest.mark.parametrize("B,H,W,C", [(2, 6, 10, 5), (1, 2, 2, 3), (3, 8, 4, 7)])
def test_patch_merging_concat_is_one_gather(B, H, W, C):
    """Swin's patch merging: four strided slices of [B, H, W, C] joined on channels."""
    b = Builder()
    x = b.input("x", T(B, H * W, C))
    g = b.reshape(x, shape=(B, H, W, C))
    r0, r1 = b.slice(g, axis=1, step=2), b.slice(g, axis=1, start=1, step=2)
    parts = [b.slice(r0, axis=2, step=2), b.slice(r1, axis=2, step=2),
             b.slice(r0, axis=2, start=1, step=2), b.slice(r1, axis=2, start=1, step=2)]
    out = b.reshape(b.concat(*parts, axis=3), shape=(B, -1, 4 * C))
    g = verify(b.ret(b.neg(out)))
    inputs = random_inputs(g, B * C)
    before = run_reference(g, inputs)
    assert fold_row_gathers(g) == 1
    verify(g)
    ops = [n.op for n in g.nodes]
    assert "concat" not in ops and "slice" not in ops and ops.count("embedding") == 1, ops
    np.testing.assert_array_equal(run_reference(g, inputs)[0], before[0])
    got = CompiledProgram(g)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_array_equal(got[0].numpy(), before[0])


def test_concat_of_two_sources_or_of_channels_left_alone():
    b = Builder()
    x = b.input("x", T(2, 4, 3))
    z = b.input("z", T(2, 4, 3))
    two = b.concat(b.slice(x, axis=1, step=2), b.slice(z, axis=1, step=2), axis=2)      # two sources
    mid = b.concat(b.slice(x, axis=1, step=2), b.slice(x, axis=1, start=1, step=2), axis=1)  # not the last axis
    chans = b.concat(b.slice(x, axis=2, end=2), b.slice(x, axis=2, start=1), axis=2)   # cut inside rows
    g = verify(b.ret(b.neg(two), b.neg(mid), b.neg(chans)))
    assert fold_row_gathers(g) == 0
