"""LeViT's linear blocks through fuse-library: hardswish (and ReLU6) after a linear layer as the
generated GEMM's epilogue, the reshape round trip transformers' ``MLPLayerWithBN`` leaves
between them dropped, and a mean over a unit axis read as a reshape (codegen/levit_blocks.py).
Odd shapes against torch and the reference interpreter; transformers' LeViT MLP block and
classifier head against eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram
from partita.codegen.library import linear_step
from partita.codegen.levit_blocks import drop_reshape_round_trip, unit_mean_as_reshape
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731

IMPORT_PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"
TORCH_ACT = {"hardswish": torch.nn.functional.hardswish, "relu6": torch.nn.functional.relu6}


@pytest.mark.parametrize("act", ["hardswish", "relu6"])
@pytest.mark.parametrize("m,k,n,layout", [(7, 13, 19, "nk"), (33, 70, 37, "kn"), (1, 5, 3, "nk"), (64, 48, 96, "nk")])
def test_linear_step_clamp_epilogue(act, m, k, n, layout):
    """The linear step with a clamp epilogue (the generated GEMM once packed) against torch."""
    torch.manual_seed(m + k + n)
    x = torch.randn(m, k) * 3
    w = torch.randn(n, k) if layout == "nk" else torch.randn(k, n)
    bias = torch.randn(n)
    step = linear_step((m, n), k, layout, True, act)
    pre = x @ (w.t() if layout == "nk" else w) + bias
    ref = TORCH_ACT[act](pre)
    for _ in range(3):   # before and after the weight is packed
        got = step([x, w, bias], {})
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert m * n < 20 or ((pre < -3).any() and (pre > 6).any())   # every piece of the clamps met


def _mlp_with_bn(B: int, Tn: int, K: int, N: int, flat_input: bool = False):
    """transformers' MLPLayerWithBN with its batch norm folded: linear, [B*T, N], back to
    [B, T, N], hardswish as torch.export writes it, then a second linear."""
    b = Builder()
    x = b.input("x", T(B * Tn, K) if flat_input else T(B, Tn, K))
    y = b.add(b.matmul(x, b.transpose(b.param("w", T(N, K)), perm=(1, 0))), b.param("bias", T(N)))
    y = b.reshape(b.reshape(y, shape=(B * Tn, N)), shape=(B, Tn, N))
    h = b.div(b.mul(y, b.minimum(b.maximum(b.add(y, b.full(shape=(), value=3.0)), b.full(shape=(), value=0.0)),
                                 b.full(shape=(), value=6.0))), b.full(shape=(), value=6.0))
    out = b.matmul(b.reshape(h, shape=(B * Tn, N)), b.transpose(b.param("w2", T(K, N)), perm=(1, 0)))
    return verify(b.ret(out))


@pytest.mark.parametrize("B,Tn,K,N,flat", [(3, 5, 7, 9, False), (4, 1, 48, 96, False), (2, 3, 5, 11, True)])
def test_hardswish_after_reshapes_is_the_linear_epilogue(B, Tn, K, N, flat):
    g = _mlp_with_bn(B, Tn, K, N, flat)
    inputs = random_inputs(g, 3)
    inputs = {k: v * 3 for k, v in inputs.items()}
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("canonicalize,fuse-library,fuse-kernels,dce").run(g))
    ops = [n.op for n in out.nodes]
    lin = [n for n in out.nodes if n.op == "linear_pointwise"]
    assert len(lin) == 2 and lin[0].attrs["unary"] == "hardswish", ops
    assert not {"fused", "maximum", "minimum", "div"} & set(ops), ops
    np.testing.assert_allclose(run_reference(out, inputs)[0], before[0], rtol=1e-5, atol=1e-5)
    got = CompiledProgram(out)({k: torch.from_numpy(v) for k, v in inputs.items()})
    scale = float(np.abs(before[0]).max())   # sums of large products: rounding relative to the largest
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-6 * scale)


def test_reshape_round_trip_only_back_to_the_same_type():
    b = Builder()
    x = b.input("x", T(2, 3, 4))
    r = b.reshape(b.reshape(x, shape=(6, 4)), shape=(2, 3, 4))
    s = b.reshape(b.reshape(x, shape=(6, 4)), shape=(3, 2, 4))
    g = verify(b.ret(b.neg(r), b.neg(s)))
    inputs = random_inputs(g, 1)
    before = run_reference(g, inputs)
    outer = [n for n in g.nodes if n.op == "reshape" and n.operands[0].producer is not None
             and n.operands[0].producer.op == "reshape"]
    assert [drop_reshape_round_trip(g, n) for n in outer] == [True, False]
    verify(g)
    for a, c in zip(before, run_reference(g, inputs)):
        np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("shape,axes,keep,taken", [((4, 1, 48), (1,), False, True), ((3, 1, 5, 1), (1, -1), True, True),
                                                   ((1, 1), None, False, True), ((4, 2, 48), (1,), False, False)])
def test_unit_mean_as_reshape(shape, axes, keep, taken):
    b = Builder()
    x = b.input("x", T(*shape))
    g = verify(b.ret(b.neg(b.mean(x, axes=axes, keepdim=keep))))
    inputs = random_inputs(g, 4)
    before = run_reference(g, inputs)
    mean = next(n for n in g.nodes if n.op == "mean")
    assert unit_mean_as_reshape(g, mean) is taken
    verify(g)
    assert ("mean" in [n.op for n in g.nodes]) is not taken
    np.testing.assert_allclose(run_reference(g, inputs)[0], before[0], rtol=1e-6)


def test_levit_mlp_and_head_against_eager():
    """transformers' LeViT residual MLP block (linear + BatchNorm1d, hardswish, linear + BN) and
    its classifier head after a one-token mean, with random batch-norm statistics, frozen."""
    pytest.importorskip("transformers")
    from transformers.models.levit import modeling_levit as ML

    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = ML.LevitResidualLayer(ML.LevitMLPLayer(input_dim=24, hidden_dim=40), drop_rate=0.0)
            self.head = ML.LevitClassificationLayer(24, 7)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.mlp(x).mean(1))

    mod = Block()
    with torch.no_grad():
        for m in mod.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
    mod.eval()
    x = torch.randn(3, 1, 24) * 2
    with torch.no_grad():
        ref = mod(x).double().numpy()
    g = partita.optimize(partita.import_torch(mod, (x,)), IMPORT_PIPELINE)
    ops = [n.op for n in g.nodes]
    assert "mean" not in ops and "fused" not in ops and ops.count("linear_pointwise") == 3, ops
    assert any(n.op == "linear_pointwise" and n.attrs["unary"] == "hardswish" for n in g.nodes)
    prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    got = np.asarray(prog([x], weights)[0])
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 1e-5, err


def _subsample(B: int, H: int, W: int, C: int, cuts: list[tuple[int, int, int | None, int]], read_slice: bool = False):
    """LeViT's queries_subsample: x [B, H*W, C] viewed [B, H, W, C], strided slices, back to [B, h*w, C]."""
    b = Builder()
    x = b.input("x", T(B, H * W, C))
    v = b.reshape(x, shape=(B, H, W, C))
    first = None
    for axis, start, end, step in cuts:
        v = b.slice(v, axis=axis, start=start, end=end, step=step)
        first = v if first is None else first
    h, w = v.type.shape[1], v.type.shape[2]
    outs = [b.neg(b.reshape(v, shape=(B, h * w, C)))] + ([b.neg(first)] if read_slice else [])
    return verify(b.ret(*outs))


@pytest.mark.parametrize("B,H,W,C,cuts", [
    (4, 2, 2, 32, [(1, 0, None, 2), (2, 0, None, 2)]),     # LeViT's zoo config
    (3, 5, 5, 7, [(1, 0, None, 2), (2, 0, None, 2)]),      # odd sides: ceil(5 / 2) = 3
    (2, 7, 4, 3, [(2, 1, None, 3), (1, 1, 6, 2)]),         # start, end, the W slice first
    (2, 6, 3, 5, [(1, 0, None, 3)]),                       # one slice only
])
def test_subsample_as_one_gather(B, H, W, C, cuts):
    g = _subsample(B, H, W, C, cuts)
    inputs = random_inputs(g, 6)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    ops = [n.op for n in out.nodes]
    assert "slice" not in ops and ops.count("embedding") == 1, ops
    np.testing.assert_array_equal(run_reference(out, inputs)[0], before[0])
    got = CompiledProgram(out)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_array_equal(got[0].numpy(), before[0])


def test_subsample_slice_read_elsewhere_stays():
    g = _subsample(2, 4, 4, 3, [(1, 0, None, 2), (2, 0, None, 2)], read_slice=True)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    assert [n.op for n in out.nodes].count("slice") == 2


@pytest.mark.parametrize("shape,sunk", [((4, 1, 48), True), ((1, 3, 1, 5), True), ((2, 3, 5), False)])
def test_unit_dims_sunk_below_the_linear(shape, sunk):
    """linear(reshape(a)) where the reshape only drops unit dims reads ``a``; one that merges
    rows ([2, 3, K] -> [6, K]) is left as it is."""
    b = Builder()
    a = b.input("a", T(*shape))
    k = shape[-1]
    rows = int(np.prod(shape[:-1]))
    y = b.add(b.matmul(b.reshape(b.neg(a), shape=(rows, k)), b.transpose(b.param("w", T(7, k)), perm=(1, 0))),
              b.param("bias", T(7)))
    g = verify(b.ret(b.neg(b.reshape(y, shape=(rows, 1, 7)))))
    inputs = random_inputs(g, 7)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    lin = next(n for n in out.nodes if n.op == "linear_pointwise")
    assert (lin.operands[0].type.shape == shape) is sunk
    if sunk:   # the reshape after it and the one back merged into one (none: back to its own shape)
        assert [n.op for n in out.nodes].count("reshape") == (0 if shape[:-1] == (rows, 1) else 1)
    np.testing.assert_allclose(run_reference(out, inputs)[0], before[0], rtol=1e-6, atol=1e-6)
    got = CompiledProgram(out)({k_: torch.from_numpy(v) for k_, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_reshape_chain_merged_unless_read_elsewhere():
    b = Builder()
    x = b.input("x", T(2, 3, 4))
    inner = b.reshape(x, shape=(6, 4))
    r = b.reshape(b.reshape(x, shape=(3, 8)), shape=(4, 6))
    s = b.reshape(inner, shape=(8, 3))
    g = verify(b.ret(b.neg(r), b.neg(s), b.neg(inner)))
    inputs = random_inputs(g, 8)
    before = run_reference(g, inputs)
    from partita.codegen.levit_blocks import merge_reshape_chain

    outer = [n for n in g.nodes if n.op == "reshape" and n.operands[0].producer is not None
             and n.operands[0].producer.op == "reshape"]
    assert [merge_reshape_chain(g, n) for n in outer] == [True, False]
    verify(g)
    for a_, c in zip(before, run_reference(g, inputs)):
        np.testing.assert_array_equal(a_, c)
