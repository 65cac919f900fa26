"""The partition pass: per-rank programs whose meaning is the global graph's.

Each test partitions a placed global graph, runs the per-rank program on every rank with
``run_mesh`` (inputs and weights cut per their placements), and compares every rank's
outputs with its piece of ``partita.run`` on the global graph (partial outputs are reduced
by the partition, so every output is a proper piece).
"""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.ir.graph import Graph
from partita.parallel import Mesh, Placement
from partita.parallel.partition import (PartitionError, PartitionPass, local_piece, partition,
                                        partition_with_report, shard_weights)
from partita.parallel.propagate import propagate
from partita.parallel.interpreter import run_mesh
from partita.passes.manager import PassManager

MLP = """graph @mlp(%x: f32[8{x},16], %w1: f32[16,64{w1}] param, %b1: f32[64{w1}] param,
               %w2: f32[64{w2},16] param) -> (f32[8,16]) {mesh} {
  %a = matmul(%x, %w1) : f32[8,64]
  %b = add(%a, %b1) : f32[8,64]
  %h = relu(%b) : f32[8,64]
  %y = matmul(%h, %w2) : f32[8,16]
  return %y
}"""


def mlp(mesh: str, x: str = "", tp: str = "") -> Graph:
    text = MLP.replace("{mesh}", mesh).replace("{x}", x).replace("{w1}", tp).replace("{w2}", tp)
    return partita.parse(text)


def arrays(g: Graph, seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    inputs, weights = {}, {}
    for v in g.inputs:
        a = rng.standard_normal(v.type.shape).astype(np.float32)
        (weights if v.role in ("param", "state") else inputs)[v.name] = a
    return inputs, weights


def check(g: Graph, seed: int = 0):
    """Propagate, partition, run on the mesh; every rank's outputs must be its pieces of
    the global outputs. Returns (per-rank graph, report, per-rank outputs, global outputs)."""
    propagate(g)
    before = g.clone()
    local, report = partition_with_report(g)
    assert g.diff(before) is None, "partition changed the global graph"
    partita.verify(local)
    mesh = g.mesh
    inputs, weights = arrays(g, seed)
    want = partita.run(g, inputs, weights)
    inputs_by_rank = [{v.name: local_piece(inputs[v.name], v.placement, mesh, r) for v in g.inputs
                       if v.name in inputs} for r in range(mesh.size)]
    outs = run_mesh(local, mesh, inputs_by_rank, shard_weights(g, weights, mesh))
    for r in range(mesh.size):
        for i, v in enumerate(g.outputs):
            p = Placement(v.placement.dims, ())
            np.testing.assert_allclose(outs[r][i], local_piece(want[i], p, mesh, r), rtol=1e-5, atol=1e-5,
                                       err_msg=f"rank {r}, output {i} ({p})")
    return local, report, outs, want


def test_data_parallel_mlp():
    g = mlp("mesh(dp=2)", x="@dp")
    local, report, outs, want = check(g)
    assert report.collectives == []
    assert [v.type.shape for v in local.inputs] == [(4, 16), (16, 64), (64,), (64, 16)]
    assert [v.role for v in local.inputs] == [v.role for v in g.inputs]
    assert [v.name for v in local.inputs] == [v.name for v in g.inputs]
    np.testing.assert_allclose(np.concatenate([outs[0][0], outs[1][0]]), want[0], rtol=1e-5, atol=1e-5)


def test_megatron_mlp_one_all_reduce():
    g = mlp("mesh(tp=2)", tp="@tp")
    local, report, outs, want = check(g)
    assert [(c.op, c.axis) for c in report.collectives] == [("all_reduce", "tp")], report.text()
    assert [n.op for n in local.nodes].count("all_reduce") == 1
    assert report.collectives[0].value == "y" and report.collectives[0].bytes > 0
    for r in range(2):
        np.testing.assert_allclose(outs[r][0], want[0], rtol=1e-5, atol=1e-5)
    assert local.inputs[1].type.shape == (16, 32) and local.inputs[3].type.shape == (32, 16)


def test_data_and_tensor_parallel_mlp():
    g = mlp("mesh(dp=2, tp=2)", x="@dp", tp="@tp")
    local, report, outs, want = check(g)
    assert [(c.op, c.axis) for c in report.collectives] == [("all_reduce", "tp")], report.text()
    assert local.inputs[0].type.shape == (4, 16)
    # Ranks 0, 1 hold the first batch half, ranks 2, 3 the second.
    np.testing.assert_allclose(outs[1][0], want[0][:4], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[2][0], want[0][4:], rtol=1e-5, atol=1e-5)


def test_data_parallel_training_step():
    fwd = mlp("mesh(dp=2)", x="@dp")
    step = partita.training_step(fwd, loss="mse", optimizer="sgd")
    target = next(v for v in step.inputs if v.name == "target")
    target.placement = Placement.split(2, {0: "dp"})
    local, report, outs, want = check(step, seed=1)
    params = [v for v in step.inputs if v.role == "param"]
    # The new params are replicated: every rank holds the single-device step's.
    for i, v in enumerate(step.outputs):
        if v.placement.is_replicated:
            for r in range(2):
                np.testing.assert_allclose(outs[r][i], want[i], rtol=1e-5, atol=1e-5)
    updated = [i for i, v in enumerate(step.outputs) if v.producer is not None and v.producer.op == "sgd_update"]
    assert len(updated) == len(params)
    grad_reduces = [c for c in report.collectives
                    if c.op == "all_reduce" and c.axis == "dp" and c.consumer.endswith("sgd_update")]
    assert len(grad_reduces) == len(params), report.text()


def test_softmax_axis_conflict_is_resharded():
    g = partita.parse("""graph @sm(%x: f32[8,16@tp]) -> (f32[8,16]) mesh(tp=2) {
      %s = softmax(%x) {axis=1} : f32[8,16]
      return %s
    }""")
    local, report, outs, want = check(g)
    assert [(c.op, c.axis, c.operand) for c in report.collectives] == [("all_to_all", "tp", 0)], report.text()
    assert report.collectives[0].consumer.endswith("softmax") and report.collectives[0].bytes == 128
    assert g.outputs[0].placement == Placement.split(2, {0: "tp"})


def test_partial_output_with_split_is_reduced_to_a_shard():
    g = mlp("mesh(dp=2, tp=2)", tp="@tp")
    local, report, outs, want = check(g)
    assert report.count("all_reduce") == 1
    assert all(np.allclose(outs[r][0], want[0], rtol=1e-5, atol=1e-5) for r in range(4))


def test_pass_registered():
    g = mlp("mesh(tp=2)", tp="@tp")
    propagate(g)
    p = PassManager.parse("partition")
    out = p.run(g)
    assert out is not g and any(n.op == "all_reduce" for n in out.nodes)
    assert PartitionPass.name == "partition"


def test_unplaced_value_is_an_error():
    g = mlp("mesh(dp=2)", x="@dp")
    with pytest.raises(PartitionError, match="run propagate first"):
        partition(g)


def test_graph_without_mesh_is_an_error():
    g = mlp("")
    with pytest.raises(PartitionError, match="no mesh"):
        partition(g)


def test_partial_weight_is_an_error():
    g = mlp("mesh(tp=2)", tp="@tp")
    propagate(g)
    g.inputs[1].placement = Placement(((), ()), ("tp",))
    with pytest.raises(PartitionError, match="pending sum"):
        shard_weights(g, arrays(g)[1], Mesh.of("tp=2"))


def test_conflict_without_a_recorded_need_falls_back_to_replicated(monkeypatch):
    # Without propagation's decision, the conflicting operand is gathered whole; the result,
    # then replicated, is cut back to its recorded placement.
    from partita.parallel import partition as mod
    monkeypatch.setattr(mod.Partitioner, "needs", lambda self: {})
    g = partita.parse("""graph @sm(%x: f32[8,16@tp]) -> (f32[8,16]) mesh(tp=2) {
      %s = softmax(%x) {axis=1} : f32[8,16]
      return %s
    }""")
    local, report, outs, want = check(g)
    assert [(c.op, c.operand) for c in report.collectives] == [("all_gather", 0), ("shard_slice", None)], report.text()
