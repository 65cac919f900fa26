"""Chains of reshapes and transposes as one transpose (codegen/move_chain.py): MobileViT's patch
unfold and fold on odd shapes against the reference interpreter and torch, the chains the rewrite
must leave alone (a lone transpose, a reshape that cuts a dim off its factors, a value read
twice), and a compiled program through fuse-library."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from partita.codegen import CompiledProgram
from partita.codegen.move_chain import chain_permutation, fold_move_chains
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731
PIPELINE = "canonicalize,fuse-library,fuse-kernels,cse,dce"


def _unfold_fold(B: int, C: int, nh: int, nw: int, ph: int, pw: int, fold: bool = True):
    """MobileViT's unfold of x [B, C, nh*ph, nw*pw] into patches [B*P, N, C] (P = ph*pw,
    N = nh*nw), a multiply in the patch layout, and (``fold``) the fold back."""
    H, W, P, N = nh * ph, nw * pw, ph * pw, nh * nw
    b = Builder()
    x = b.input("x", T(B, C, H, W))
    s = b.input("s", T(C))
    u = b.reshape(b.mul(x, x), shape=(B * C * nh, ph, nw, pw))
    u = b.reshape(b.transpose(u, perm=(0, 2, 1, 3)), shape=(B, C, N, P))
    u = b.reshape(b.transpose(u, perm=(0, 3, 2, 1)), shape=(B * P, N, C))
    y = b.mul(u, s)
    if not fold:
        return verify(b.ret(y))
    f = b.reshape(y, shape=(B, P, N, C))
    f = b.reshape(b.transpose(f, perm=(0, 3, 2, 1)), shape=(B * C * nh, nw, ph, pw))
    f = b.reshape(b.transpose(f, perm=(0, 2, 1, 3)), shape=(B, C, H, W))
    return verify(b.ret(b.add(f, x)))


def _torch_unfold_fold(inputs: dict, B: int, C: int, nh: int, nw: int, ph: int, pw: int) -> np.ndarray:
    x = torch.from_numpy(inputs["x"]).double()
    s = torch.from_numpy(inputs["s"]).double()
    H, W, P, N = nh * ph, nw * pw, ph * pw, nh * nw
    u = (x * x).reshape(B * C * nh, ph, nw, pw).transpose(1, 2).reshape(B, C, N, P)
    y = u.transpose(1, 3).reshape(B * P, N, C) * s
    f = y.reshape(B, P, N, C).transpose(1, 3).reshape(B * C * nh, nw, ph, pw).transpose(1, 2)
    return (f.reshape(B, C, H, W) + x).numpy()


SHAPES = [(4, 16, 2, 2, 2, 2), (2, 5, 3, 2, 2, 3), (1, 3, 1, 1, 2, 2), (3, 7, 2, 5, 1, 2), (2, 24, 1, 1, 2, 2)]


@pytest.mark.parametrize("B,C,nh,nw,ph,pw", SHAPES)
def test_unfold_and_fold_are_one_transpose_each(B, C, nh, nw, ph, pw):
    g = _unfold_fold(B, C, nh, nw, ph, pw)
    inputs = random_inputs(g, B + C + nh)
    before = run_reference(g, inputs)
    np.testing.assert_allclose(before[0], _torch_unfold_fold(inputs, B, C, nh, nw, ph, pw), rtol=1e-6, atol=1e-6)
    assert fold_move_chains(g) == 2
    verify(g)
    assert sum(n.op == "transpose" for n in g.nodes) <= 2
    np.testing.assert_array_equal(run_reference(g, inputs)[0], before[0])


@pytest.mark.parametrize("B,C,nh,nw,ph,pw", SHAPES[:3])
def test_compiled_through_fuse_library(B, C, nh, nw, ph, pw):
    g = _unfold_fold(B, C, nh, nw, ph, pw)
    inputs = random_inputs(g, 7)
    want = run_reference(g, inputs)[0]
    out = verify(PassManager.parse(PIPELINE).run(_unfold_fold(B, C, nh, nw, ph, pw)))
    assert sum(n.op == "transpose" for n in out.nodes) <= 2
    got = CompiledProgram(out, freeze=True)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), want, rtol=1e-6, atol=1e-6)


def _apply(shape: tuple, chain: list) -> np.ndarray:
    y = np.arange(int(np.prod(shape))).reshape(shape)
    for op, a in chain:
        y = y.reshape(a) if op == "reshape" else y.transpose(a)
    return y


@pytest.mark.parametrize("shape,chain", [
    ((4, 16, 4, 4), [("reshape", (128, 2, 2, 2)), ("transpose", (0, 2, 1, 3)), ("reshape", (4, 16, 4, 4)),
                     ("transpose", (0, 3, 2, 1)), ("reshape", (16, 4, 16))]),
    ((3, 5, 6, 10), [("reshape", (45, 2, 5, 2)), ("transpose", (0, 2, 1, 3)), ("reshape", (3, 5, 15, 4)),
                     ("transpose", (0, 3, 2, 1)), ("reshape", (12, 15, 5))]),
    ((6, 4), [("transpose", (1, 0)), ("reshape", (2, 2, 6)), ("transpose", (2, 1, 0))]),
    ((1, 6, 1, 4), [("transpose", (3, 2, 1, 0)), ("reshape", (4, 3, 2)), ("transpose", (1, 0, 2))]),
    ((2, 3), [("transpose", (1, 0)), ("transpose", (1, 0))]),
])
def test_the_permutation_gives_the_chain(shape, chain):
    factors, perm = chain_permutation(shape, chain)
    want = _apply(shape, chain)
    x = np.arange(int(np.prod(shape)))
    np.testing.assert_array_equal(x.reshape(factors).transpose(perm).reshape(want.shape), want)


def test_a_reshape_off_the_factors_is_refused():
    # [6, 4] transposed is [4, 6]; cut as [3, 8] the first dim ends inside a factor of 4
    assert chain_permutation((6, 4), [("transpose", (1, 0)), ("reshape", (3, 8)), ("transpose", (1, 0))]) is None


def test_a_lone_transpose_and_a_shared_value_stay():
    b = Builder()
    x = b.input("x", T(2, 3, 4))
    t = b.reshape(b.transpose(b.reshape(x, shape=(6, 4)), perm=(1, 0)), shape=(4, 2, 3))   # one transpose
    m = b.transpose(b.reshape(x, shape=(2, 12)), perm=(1, 0))
    shared = b.reshape(m, shape=(3, 4, 2))                                    # m read twice below
    g = verify(b.ret(t, b.transpose(shared, perm=(2, 1, 0)), b.mul(m, m)))
    inputs = random_inputs(g, 1)
    before = run_reference(g, inputs)
    made = fold_move_chains(g)
    verify(g)
    assert made == 0
    for got, ref in zip(run_reference(g, inputs), before):
        np.testing.assert_array_equal(got, ref)
