"""A training dropout split over mesh axes draws the unsplit dropout's mask for its elements
(the op's origin/whole operands and local_forms.dropout), so a per-rank program with a split
dropout computes what the single-device program computes, and tensor parallelism no longer
keeps weights whole because of a dropout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita
from partita.ir import Builder, Graph, TensorType
from partita.ir.diagnostics import TypeRuleError
from partita.ir.dtypes import f32, i64
from partita.ops.nn import _np_dropout, _torch_dropout
from partita.parallel.strategy import parallelize


def test_a_piece_with_its_origin_draws_the_whole_mask():
    x = np.random.default_rng(0).standard_normal((4, 6, 5)).astype(np.float32)
    attrs = dict(p=0.3, train=True, seed=7, whole=None)
    full = _np_dropout([x], attrs)
    piece = dict(attrs, whole=(4, 6, 5))
    got = _np_dropout([x[2:4, 3:6, 1:5], np.array([2, 3, 1])], piece)
    np.testing.assert_array_equal(got, full[2:4, 3:6, 1:5])
    t = _torch_dropout([torch.from_numpy(np.ascontiguousarray(x[2:4, 3:6, 1:5])), torch.tensor([2, 3, 1])], piece)
    np.testing.assert_array_equal(t.numpy(), got)
    assert (got == 0).any() and (got != 0).any()


def test_origin_and_whole_are_checked():
    b = Builder(Graph("g"))
    x = b.input("x", TensorType((2, 3), f32))
    o = b.input("o", TensorType((2,), i64))
    with pytest.raises(TypeRuleError, match="whole=None must give the global shape"):
        b.dropout(x, o, p=0.1, train=True)
    with pytest.raises(TypeRuleError, match="whole=.* must give the global shape"):
        b.dropout(x, o, p=0.1, train=True, whole=(1, 3))
    with pytest.raises(TypeRuleError, match="needs the origin operand"):
        b.dropout(x, p=0.1, train=True, whole=(2, 3))


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-3))


@pytest.mark.parametrize("attention", ["fused", "eager", "fused_softmax"])
@pytest.mark.parametrize("mesh,strategy", [("dp=2", "dp"), ("tp=2", "megatron"), ("dp=2,tp=2", "dp+megatron"),
                                           ("tp=2", "megatron+sp")])
def test_split_dropout_matches_single_device(attention, mesh, strategy):
    g = partita.models.gpt(layers=2, hidden=32, heads=4, seq=8, vocab=64, batch=4, dtype="f32",
                           attention=attention, dropout=0.2)
    step = partita.training_step(g, loss="cross_entropy", optimizer=None)
    rng = np.random.default_rng(0)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(np.float32)
         for v in step.inputs if v.role == "param"}
    feed = {"ids": rng.integers(0, 64, (4, 8)), "target": rng.integers(0, 64, (4, 8))}
    want = partita.run(step, feed, w)
    prog = parallelize(step, mesh, strategy)
    assert "kept whole" not in prog.plan.text()
    split = [n for n in prog.local.nodes if n.op == "dropout" and len(n.operands) == 2]
    if "dp" in mesh or attention != "fused" or "sp" in strategy:
        assert split, "the dropouts of split activations should run split"
    got = prog.simulate(feed, w)
    for v, a, b in zip(step.outputs, got, want):
        assert _rel(a, b) < 1e-5, f"{strategy} on {mesh}: %{v.name} differs by {_rel(a, b):.2e}"


@pytest.mark.parametrize("mesh,strategy,recompute,extra", [
    ("pp=2", "pp", "full", {}),
    ("pp=2,dp=2", "pp+dp", "none", {}),
    ("pp=2,dp=2", "pp+dp", "full", {"schedule": "interleaved", "virtual_stages": 2}),
    ("pp=2,dp=2,tp=2", "pp+dp+megatron", "selective", {}),
    ("pp=2,tp=2", "pp+megatron+sp", "selective", {"attention": "fused_softmax"}),
])
def test_pipelines_with_dropout_match_single_device(mesh, strategy, recompute, extra):
    """Microbatch m of a pipeline holds the batch's rows [m*B/M, (m+1)*B/M), each data-parallel
    rank a share of it (PipelineProgram._mb_major), so its dropouts draw the step's mask; a
    recomputed dropout draws it again."""
    extra = dict(extra)
    g = partita.models.gpt(layers=4, hidden=32, heads=4, seq=8, vocab=64, batch=8, dtype="f32",
                           attention=extra.pop("attention", "eager"), dropout=0.1)
    step = partita.training_step(g, loss="cross_entropy", optimizer="sgd", recompute=recompute)
    rng = np.random.default_rng(0)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(np.float32)
         for v in step.inputs if v.role == "param"}
    feed = {"ids": rng.integers(0, 64, (8, 8)), "target": rng.integers(0, 64, (8, 8))}
    want = partita.run(step, feed, w)
    prog = partita.parallelize(step, mesh=mesh, strategy=strategy, microbatches=2, **extra)
    # The stages are cut on the forward alone: each chunk sends the hidden state on (and the
    # tied embedding's gradient back), not the backward's values (the backward's dropouts,
    # which replay the forward's masks, once dragged it into the forward cone).
    for ch in prog.pipeline.cut.chunks:
        assert len(ch.send) <= 1, f"chunk {ch.index} sends {len(ch.send)} values: " + \
            ", ".join(f"{v.producer.op if v.producer else v.name} {v.type}" for v in ch.send)
    got = prog.simulate(feed, w)
    for v, a, b in zip(step.outputs, got, want):
        assert _rel(a, b) < 1e-4, f"{strategy} on {mesh}: %{v.name} differs by {_rel(a, b):.2e}"
