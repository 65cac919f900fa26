"""LeViT's attention taken into one node (codegen/attention_spelled.py): k^T straight from the
[B, S, H, E] projection (``transpose(x, [0, 2, 3, 1])``) and the per-head attention biases
[H, T, S] added to the scores as the attention's mask; its linear layers of a 3-d input that
torch writes as a product by the weight broadcast over the batch read the 2-d weight
(codegen/batched_weight.py). Reference interpreter before and after on odd shapes, the compiled
program against it, and LeViT's two attention modules (transformers) against eager."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram
from partita.codegen.attention_spelled import fuse_spelled_attention
from partita.codegen.batched_weight import unbroadcast_weight
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731

IMPORT_PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


def _levit_spelled(B: int, H: int, T_: int, S: int, E: int, EV: int, bias: str = "heads", batched: bool = True):
    """LeViT's attention as it is imported: q, k and v permuted from [B, *, H, E], k^T as one
    transpose of k's [B, S, H, E], 3-d matmuls between reshapes (or 4-d ones), ``* scale``, the
    bias [H, T, S] (or [T, S], or none) added, softmax, times v."""
    b = Builder()
    q4, k4, v4 = b.input("q", T(B, T_, H, E)), b.input("k", T(B, S, H, E)), b.input("v", T(B, S, H, EV))
    q = b.transpose(q4, perm=(0, 2, 1, 3))
    kt = b.transpose(k4, perm=(0, 2, 3, 1))
    v = b.transpose(v4, perm=(0, 2, 1, 3))
    if batched:
        s = b.reshape(b.matmul(b.reshape(q, shape=(B * H, T_, E)), b.reshape(kt, shape=(B * H, E, S))),
                      shape=(B, H, T_, S))
    else:
        s = b.matmul(q, kt)
    s = b.mul(s, b.full(shape=(), value=E ** -0.5))
    if bias == "heads":
        s = b.add(s, b.input("bias", T(H, T_, S)))
    elif bias == "shared":
        s = b.add(s, b.input("bias", T(T_, S)))
    p = b.softmax(s)
    if batched:
        o = b.reshape(b.matmul(b.reshape(p, shape=(B * H, T_, S)), b.reshape(v, shape=(B * H, S, EV))),
                      shape=(B, H, T_, EV))
    else:
        o = b.matmul(p, v)
    return verify(b.ret(b.transpose(o, perm=(0, 2, 1, 3))))


def _fuse(g):
    """fuse_spelled_attention on each softmax, then fuse-library; the reference before and after."""
    inputs = random_inputs(g, 5)
    before = run_reference(g, inputs)
    for n in [n for n in g.nodes if n.op == "softmax"]:
        fuse_spelled_attention(g, n)
    out = verify(PassManager.parse("dce,fuse-library,dce").run(g))
    after = run_reference(out, inputs)
    for a, c in zip(before, after):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    return out, inputs, before


@pytest.mark.parametrize("B,H,T_,S,E,EV,bias,batched", [
    (3, 3, 7, 7, 5, 16, "heads", True),      # odd sizes, the generated kernel (v head 16)
    (2, 2, 3, 9, 8, 32, "heads", True),      # subsampled queries: fewer queries than keys
    (1, 5, 1, 4, 3, 16, "heads", False),     # one query, 4-d matmuls
    (2, 3, 5, 6, 7, 12, "shared", True),     # v head 12: the library's kernel
    (3, 2, 4, 4, 8, 16, "none", True),       # no bias
])
def test_levit_attention_one_node(B, H, T_, S, E, EV, bias, batched):
    g = _levit_spelled(B, H, T_, S, E, EV, bias, batched)
    out, inputs, before = _fuse(g)
    ops = [n.op for n in out.nodes]
    assert ops.count("attention") == 1 and "softmax" not in ops and ops.count("matmul") == 0, ops
    att = next(n for n in out.nodes if n.op == "attention")
    assert len(att.operands) == (3 if bias == "none" else 4)
    assert math.isclose(att.attrs["scale"], E ** -0.5, rel_tol=1e-6)
    prog = CompiledProgram(out)
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-6)


def test_kt_read_elsewhere_left_alone():
    """k^T read by another node too: the chain is left as it was (nothing made stays)."""
    b = Builder()
    B, H, S, E = 2, 2, 4, 8
    q4, k4, v4 = b.input("q", T(B, S, H, E)), b.input("k", T(B, S, H, E)), b.input("v", T(B, S, H, 16))
    kt = b.transpose(k4, perm=(0, 2, 3, 1))
    s = b.matmul(b.transpose(q4, perm=(0, 2, 1, 3)), kt)
    o = b.matmul(b.softmax(s), b.transpose(v4, perm=(0, 2, 1, 3)))
    g = verify(b.ret(o, b.neg(kt)))
    n_before = len(list(g.nodes))
    sm = next(n for n in g.nodes if n.op == "softmax")
    assert fuse_spelled_attention(g, sm) is None
    assert len(list(g.nodes)) == n_before and not any(n.op == "attention" for n in g.nodes)
    verify(g)


def _linear3d(B: int, Tn: int, K: int, N: int, read_twice: bool = False):
    """torch's linear of a non-contiguous 3-d input: x @ broadcast_to(w^T, [B, K, N]) + bias."""
    b = Builder()
    x = b.transpose(b.input("x", T(B, K, Tn)), perm=(0, 2, 1))
    w = b.transpose(b.param("w", T(N, K)), perm=(1, 0))
    wb = b.broadcast_to(w, shape=(B, K, N))
    y = b.add(b.matmul(x, wb), b.param("bias", T(N)))
    outs = [y] + ([b.neg(wb)] if read_twice else [])
    return verify(b.ret(*outs))


@pytest.mark.parametrize("B,Tn,K,N", [(3, 5, 7, 9), (4, 1, 32, 16)])
def test_broadcast_weight_linear(B, Tn, K, N):
    g = _linear3d(B, Tn, K, N)
    inputs = random_inputs(g, 2)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    ops = [n.op for n in out.nodes]
    assert "broadcast_to" not in ops and "matmul" not in ops and ops.count("linear_pointwise") == 1, ops
    np.testing.assert_allclose(run_reference(out, inputs)[0], before[0], rtol=1e-5, atol=1e-6)
    got = CompiledProgram(out)({k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_broadcast_read_elsewhere_stays():
    g = _linear3d(2, 3, 4, 5, read_twice=True)
    mm = next(n for n in g.nodes if n.op == "matmul")
    assert not unbroadcast_weight(g, mm)
    assert mm.operands[1].producer is not None and mm.operands[1].producer.op == "broadcast_to"


def _levit_modules():
    from transformers.models.levit import modeling_levit as ML

    torch.manual_seed(0)
    att = ML.LevitAttention(hidden_sizes=24, key_dim=5, num_attention_heads=3, attention_ratio=2, resolution=3)
    sub = ML.LevitAttentionSubsample(input_dim=24, output_dim=40, key_dim=6, num_attention_heads=2,
                                     attention_ratio=2, stride=2, resolution_in=5, resolution_out=3)
    return [(att, torch.randn(3, 9, 24)), (sub, torch.randn(2, 25, 24))]


@pytest.mark.parametrize("which", [0, 1])
def test_levit_modules_against_eager(which):
    """LeViT's attention and subsampling attention (random biases and batch-norm statistics):
    one attention node each, the compiled program (params frozen) against eager."""
    pytest.importorskip("transformers")
    mod, x = _levit_modules()[which]
    with torch.no_grad():
        for m in mod.modules():
            if isinstance(m, torch.nn.BatchNorm1d):
                m.running_mean.normal_()
                m.running_var.uniform_(0.5, 2.0)
                m.weight.normal_()
                m.bias.normal_()
        mod.attention_biases.normal_()
    mod.eval()
    with torch.no_grad():
        ref = mod(x).double().numpy()
    g = partita.optimize(partita.import_torch(mod, (x,)), IMPORT_PIPELINE)
    ops = [n.op for n in g.nodes]
    assert ops.count("attention") == 1 and "softmax" not in ops and "broadcast_to" not in ops, ops
    prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [x for v in g.inputs if v.role == "input"]
    got = np.asarray(prog(args, weights)[0])
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 1e-5, err
