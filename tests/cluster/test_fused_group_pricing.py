"""Elementwise chains priced as the code generator's fusion pass groups them
(partita/cluster/fused_groups.py): one memory pass per group, an op the pass does not fuse
priced alone, the grouping computed once per graph."""

from __future__ import annotations

import dataclasses

import pytest

from partita.cluster import load_cluster
from partita.cluster.cost import CostModel
from partita.cluster.fused_groups import fused_time, pricing_groups
from partita.cluster.simulator import SimulationError, prepare, simulate
from partita.ir.dtypes import bf16, f32
from partita.ir.graph import Graph, Node
from partita.ir.types import TensorType


def chain(dtype=f32) -> tuple[Graph, list[Node]]:
    """y = gelu(x * w + b) followed by a matmul (not elementwise) of y with m."""
    g = Graph("chain")
    t = TensorType((256, 512), dtype)
    x, w, b = g.add_input("x", t), g.add_input("w", t), g.add_input("b", t)
    m = g.add_input("m", TensorType((512, 64), dtype))
    mul = g.append(Node("mul", [x, w], {}, [t]))
    add = g.append(Node("add", [mul.results[0], b], {}, [t]))
    act = g.append(Node("gelu", [add.results[0]], {"approximate": "none"}, [t]))
    mm = g.append(Node("matmul", [act.results[0], m], {}, [TensorType((256, 64), dtype)]))
    g.set_outputs([mm.results[0]])
    return g, [mul, add, act, mm]


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_a_chain_is_one_memory_pass(dtype):
    g, (mul, add, act, mm) = chain(dtype)
    groups = pricing_groups(g)
    assert len(groups) == 1 and groups[0].root is act
    model = CostModel(load_cluster("selene"), groups=True)
    whole = fused_time(model, act)
    nbytes = 256 * 512 * dtype.bits // 8
    assert whole is not None and whole.bytes == 4 * nbytes          # x, w, b read; y written
    alone = [model.compute_time(n) for n in (mul, add, act)]
    assert whole.flops == sum(t.flops for t in alone)
    t, _ = model.roofline(4 * nbytes, whole.flops, "gelu")
    assert whole.seconds == pytest.approx(t + model.eff.op_overhead)
    assert whole.seconds < sum(t.seconds for t in alone)
    assert fused_time(model, mul).seconds == 0.0 and fused_time(model, add).seconds == 0.0
    assert fused_time(model, mm) is None                              # not elementwise: alone
    p = prepare(g, model)
    assert p.durations == pytest.approx([0.0, 0.0, whole.seconds, model.compute_time(mm).seconds])
    assert p.flops == pytest.approx(sum(model.compute_time(n).flops for n in (mul, add, act, mm)))


@pytest.mark.parametrize("kw", [dict(), dict(groups=False)])
def test_off_prices_every_op_alone(kw):
    g, nodes = chain()
    model = CostModel(load_cluster("selene"), **kw)
    assert fused_time(model, nodes[2]) is None
    assert prepare(g, model).durations == [model.compute_time(n).seconds for n in nodes]



def test_the_grouping_is_computed_once_per_graph():
    g, _ = chain()
    model = CostModel(load_cluster("selene"), groups=True)
    a = prepare(g, model)
    b = prepare(g, model, {})
    assert model.groupings == 1 and a.durations == b.durations
    g2, _ = chain()
    prepare(g2, model)
    assert model.groupings == 2


def test_simulate_takes_the_option_and_refuses_a_bad_one():
    g, _ = chain()
    on = simulate(g, "selene", fuse_groups=True, memory=False)
    off = simulate(g, "selene", memory=False, fuse_groups=False)
    assert on.step_time < off.step_time
    # On by default for a compiled step; off where an eager loop is priced (each op its kernel).
    assert simulate(g, "selene", memory=False).step_time == on.step_time
    assert simulate(g, "selene", memory=False, fusion="eager").step_time == \
        simulate(g, "selene", memory=False, fusion="eager", fuse_groups=False).step_time
    # Off by default on a cluster whose runtime runs no fused groups (a calibrated CPU file).
    plain = dataclasses.replace(load_cluster("selene"), fused_groups=False)
    assert simulate(g, plain, memory=False).step_time == simulate(g, plain, memory=False, fuse_groups=False).step_time
    assert simulate(g, plain, memory=False, fuse_groups=True).step_time == on.step_time
    with pytest.raises(SimulationError, match="fuse_groups"):
        simulate(g, "selene", fuse_groups="yes")


def test_a_group_stays_between_sends_and_recvs():
    """In a pipeline's unrolled program the fusion pass would chain a gradient's sum over the
    microbatches into one kernel; the pricing keeps each microbatch's add apart, as the
    section templates do, and both simulations agree."""
    import partita
    from partita.codegen.fusion import plan_groups
    from partita.ops.kinds import P2P_OPS

    fwd = partita.models.gpt(layers=2, hidden=32, heads=2, seq=8, vocab=64, batch=8, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    kw = dict(mesh="pp=2", strategy="pp", schedule="1f1b", microbatches=4)
    full = partita.parallelize(step, **kw)
    g = full.rank_graphs()[0]

    def spans(groups: list) -> int:
        pos = {n: i for i, n in enumerate(g.nodes)}
        p2p = [pos[n] for n in g.nodes if n.op in P2P_OPS]
        return sum(1 for x in groups if any(min(pos[n] for n in x.members if n.operands) < p < pos[x.root]
                                            for p in p2p))

    assert spans(plan_groups(g, any_float=True)) > 0
    assert spans(pricing_groups(g)) == 0
    a = simulate(full, "selene", memory=False, fuse_groups=True)
    b = simulate(partita.parallelize(step, unroll=False, **kw), "selene", fuse_groups=True)
    assert b.step_time == pytest.approx(a.step_time, rel=1e-9)
