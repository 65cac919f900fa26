"""The propagate pass: placements from a few annotations to every value.

Besides the expected placements, every test checks the meaning of the result with
``assert_consistent``: each node's result placements are what its sharding rule gives on
its operand placements, except where a reshard need is recorded for the node, and then the
rule applied to the operands as the needs reshard them gives exactly the recorded results.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import partita
from partita.ir.graph import Graph
from partita.ir.printer import value_names
from partita.parallel import Mesh, Placement
from partita.parallel.propagate import PropagatePass, PropagationError, PropagationReport, propagate
from partita.parallel.reshard import plan_bytes, plan_reshard
from partita.parallel.sharding import Conflict, result_placements, sharding_spec
from partita.passes.manager import PassManager

MLP = """graph @mlp(%x: f32[32{x},16], %w1: f32[16,64{w1}] param, %b1: f32[64{b1}] param,
               %w2: f32[64{w2},16] param) -> (f32[32{out},16]) mesh(dp=2, tp=2) {
  %a = matmul(%x, %w1) : f32[32,64]
  %b = add(%a, %b1) : f32[32,64]
  %h = relu(%b) : f32[32,64]
  %y = matmul(%h, %w2) : f32[32{out},16]
  return %y
}"""


def mlp(x: str = "", w1: str = "", w2: str = "", out: str = "") -> Graph:
    text = MLP
    for key, split_on in (("x", x), ("w1", w1), ("b1", w1), ("w2", w2), ("out", out)):
        text = text.replace("{" + key + "}", split_on)
    return partita.parse(text)


def value(g: Graph, name: str):
    return next(v for v in g.values() if v.name == name)


def split(rank: int, dims: dict, partial=()) -> Placement:
    return Placement.split(rank, dims, partial)


def assert_consistent(g: Graph, report: PropagationReport) -> None:
    """Every value placed; every node's results follow from its operands by its rule,
    once the recorded reshards are applied."""
    partita.verify(g)
    for v in g.values():
        assert v.placement is not None, f"{v!r} has no placement"
    names = value_names(g)
    needs: dict = {}
    for need in report.reshards:
        assert need.node is not None and need.bytes >= 0
        needs.setdefault(need.node, []).append(need)
    for node in g.nodes:
        wants = [o.placement for o in node.operands]
        expected = [r.placement for r in node.results]
        for need in needs.get(node, []):
            if need.operand is None:
                (r,) = [r for r in node.results if names[r] == need.value]
                assert need.want == r.placement
                expected[r.index] = need.have
            else:
                assert need.have == wants[need.operand]
                assert plan_bytes(plan_reshard(node.operands[need.operand].type.shape,
                                               node.operands[need.operand].type.dtype,
                                               need.have, need.want, g.mesh)) == need.bytes
                wants[need.operand] = need.want
        spec = sharding_spec(node.op, [o.type for o in node.operands], node.attrs)
        if spec is None:
            assert all(w.is_replicated for w in wants), node
            got = [Placement.replicated(r.type.rank) for r in node.results]
        else:
            got = result_placements(spec, wants, [o.type for o in node.operands], g.mesh,
                                    [r.type for r in node.results])
            assert not isinstance(got, Conflict), f"{node}: {got}"
        assert got == expected, f"{node}: the rule gives {[str(p) for p in got]}, placed {[str(p) for p in expected]}"


def test_data_parallel_mlp_splits_activations_and_replicates_weights() -> None:
    g = mlp(x="@dp")
    report = propagate(g)
    dp0 = split(2, {0: "dp"})
    for name in ("x", "a", "b", "h", "y"):
        assert value(g, name).placement == dp0, name
    for name in ("w1", "w2"):
        assert value(g, name).placement.is_replicated
    assert value(g, "b1").placement == Placement.replicated(1)
    assert report.reshards == [] and report.replicated == []
    assert report.placements["h"] == "[dp, -]" and report.placements["w1"] == "replicated"
    assert_consistent(g, report)


def test_megatron_mlp_keeps_the_partial_sum() -> None:
    g = mlp(w1="@tp", w2="@tp")
    report = propagate(g)
    assert value(g, "h").placement == split(2, {1: "tp"})
    assert value(g, "y").placement == Placement(((), ()), ("tp",))
    assert value(g, "x").placement.is_replicated
    assert report.reshards == []
    assert "%y: [-, -] partial(tp)" in report.text()
    assert_consistent(g, report)


def test_training_step_gradients_are_partial_over_dp() -> None:
    step = partita.training_step(mlp(x="@dp"), loss="mse", optimizer="sgd")
    report = propagate(step)
    assert_consistent(step, report)
    grads = [v for v in step.values() if str(v.name).endswith(".grad")]
    assert {str(v.name) for v in grads} == {"w1.grad", "b1.grad", "w2.grad"}
    for v in grads:
        assert v.placement == Placement(((),) * v.type.rank, ("dp",)), (v.name, v.placement)
    # The update needs the whole gradient: data parallelism's all-reduce, one per parameter.
    updates = {need.value: need for need in report.reshards if need.node.op == "sgd_update"}
    assert set(updates) == {"w1.grad", "b1.grad", "w2.grad"}
    for need in updates.values():
        assert need.want.is_replicated and need.operand == 1
    assert updates["w1.grad"].bytes == 2 * (2 - 1) * 16 * 64 * 4 // 2  # ring all_reduce over dp=2
    for name in ("w1", "b1", "w2", "w1.1", "b1.1", "w2.1"):
        assert value(step, name).placement.is_replicated, name


def test_split_softmax_axis_records_the_cheaper_reshard() -> None:
    g = partita.parse("""graph @s(%x: f32[8,16@tp]) -> (f32[8,16]) mesh(tp=2) {
      %y = softmax(%x) {axis=1} : f32[8,16]
      %z = exp(%y) : f32[8,16]
      return %z
    }""")
    report = propagate(g)
    (need,) = report.reshards
    assert (need.value, need.operand, need.node.op) == ("x", 0, "softmax")
    assert need.have == split(2, {1: "tp"})
    # Moving the split to the rows (one all_to_all, 128 bytes) is cheaper than gathering (256).
    assert need.want == split(2, {0: "tp"}) and need.bytes == 128
    assert value(g, "y").placement == value(g, "z").placement == split(2, {0: "tp"})
    assert "%x -> operand 0 of %y = softmax: [-, tp] -> [tp, -], 128 bytes sent per rank" in report.text()
    assert value(g, "x").placement == split(2, {1: "tp"}), "annotations are fixed"
    assert_consistent(g, report)


def test_conflicting_operands_take_the_cheaper_side() -> None:
    # %a is split on dp, %b on its other dim: resharding the small %b is cheaper.
    g = partita.parse("""graph @c(%a: f32[64@dp,8], %b: f32[64,8@dp], %c: f32[4,8]) -> (f32[64,8]) mesh(dp=2) {
      %s = add(%a, %b) : f32[64,8]
      %t = relu(%b) : f32[64,8]
      %u = add(%s, %t) : f32[64,8]
      return %u
    }""")
    report = propagate(g)
    assert value(g, "s").placement == split(2, {0: "dp"})
    needs = [(n.value, n.node.op, n.want) for n in report.reshards]
    assert ("b", "add", split(2, {0: "dp"})) in needs
    assert all(n.bytes > 0 for n in report.reshards)
    assert_consistent(g, report)


def test_backward_from_an_annotated_output() -> None:
    g = mlp(out="@dp")
    report = propagate(g)
    dp0 = split(2, {0: "dp"})
    for name in ("x", "a", "b", "h", "y"):
        assert value(g, name).placement == dp0, name
    for name in ("w1", "b1", "w2"):
        assert value(g, name).placement.is_replicated, name
    assert report.reshards == []
    assert_consistent(g, report)


def test_op_without_a_rule_is_replicated_and_reported() -> None:
    # embedding_grad has a rule; without it, it stands for an op that has none.
    from partita.parallel.sharding import RULES
    with RULES.override("embedding_grad", None):
        g = partita.parse("""graph @e(%dy: f32[8,4@dp], %i: i64[8]) -> (f32[10,4]) mesh(dp=2) {
          %r = relu(%dy) : f32[8,4]
          %t = embedding_grad(%r, %i) {num_embeddings=10} : f32[10,4]
          %u = neg(%t) : f32[10,4]
          return %u
        }""")
        report = propagate(g)
        assert value(g, "r").placement == split(2, {1: "dp"})
        assert value(g, "t").placement.is_replicated and value(g, "u").placement.is_replicated
        assert report.replicated == ["%t = embedding_grad: replicated: no sharding rule"]
        (need,) = report.reshards
        assert (need.value, need.operand, need.want) == ("r", 0, Placement.replicated(2))
        assert "replicated: no sharding rule: 1" in report.text()
        assert_consistent(g, report)


def test_annotated_result_the_producer_cannot_give_is_a_recorded_reshard() -> None:
    g = partita.parse("""graph @r(%x: f32[8,4@dp], %w: f32[4,4]) -> (f32[8@dp,4]) mesh(dp=2) {
      %y = matmul(%x, %w) : f32[8,4]
      %z = relu(%y) : f32[8@dp,4]
      return %z
    }""")
    value(g, "y").placement = Placement.replicated(2)
    report = propagate(g)
    assert value(g, "y").placement.is_replicated and value(g, "z").placement == split(2, {0: "dp"})
    assert report.reshards, "the annotations disagree with the rules, so something must move"
    assert_consistent(g, report)


def _autodiff_models():
    sys.path.insert(0, str(Path(__file__).parents[1] / "autodiff"))
    try:
        import torch
        from test_training import MLP as TorchMLP, SmallCNN
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    return [(TorchMLP(), torch.randn(16, 12)), (SmallCNN(), torch.randn(4, 3, 16, 16))]


def test_fixed_point_terminates_on_autodiff_training_steps() -> None:
    for k, (model, x) in enumerate(_autodiff_models()):
        fwd = partita.import_torch(model.eval(), (x,))
        step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd")
        step.mesh = Mesh.of("dp=2")
        for v in step.inputs:
            if v.role == "input":
                v.placement = split(v.type.rank, {0: "dp"})
        report = propagate(step)
        assert report.rounds <= sum(1 for _ in step.values()) + 1
        assert len(report.placements) == sum(1 for _ in step.values())
        assert_consistent(step, report)
        updates = [n for n in step.nodes if n.op == "sgd_update"]
        partial = [n.operands[1].placement.partial == ("dp",) for n in updates]
        if k == 0:
            # Every gradient of the MLP reaches its update as a pending sum over dp.
            assert updates and all(partial)
        else:
            # Every op of the CNN's step has a rule; its head's gradients reach their updates
            # as pending sums over dp (the others are reduced where they are produced).
            assert any(partial)
            assert not any("conv2d_grad" in line or "batch_norm_grad" in line for line in report.replicated)


def test_the_pass_in_a_pipeline_keeps_its_report() -> None:
    g = partita.parse("""graph @p(%x: f32[8,4]) -> (f32[8,4]) {
      %y = relu(%x) : f32[8,4]
      return %y
    }""")
    pm = PassManager.parse("propagate{mesh=dp:2}")
    out = pm.run(g)
    (p,) = pm.passes
    assert isinstance(p, PropagatePass) and p.report is not None
    assert out.mesh == Mesh.of("dp=2") and p.report.placements == {"x": "replicated", "y": "replicated"}


def test_errors() -> None:
    g = partita.parse("""graph @p(%x: f32[8,4]) -> (f32[8,4]) {
      %y = relu(%x) : f32[8,4]
      return %y
    }""")
    with pytest.raises(PropagationError, match=r"@p: .*set graph.mesh or pass mesh=\.\.\."):
        propagate(g)
    g.mesh = Mesh.of("dp=3")
    g.inputs[0].placement = split(2, {0: "dp"})
    with pytest.raises(PropagationError, match=r"annotated on %x does not fit it: dim 0 of %x \(size 8\) "
                                               r"does not divide over dp=3"):
        propagate(g)
    g.inputs[0].placement = split(2, {1: "tp"})
    with pytest.raises(PropagationError, match="uses mesh axis 'tp', which mesh\\(dp=3\\) does not have"):
        propagate(g)
