"""The automatic planner (partita/planning, docs/plan.md): small models on one-node clusters.

Plans are chosen by the simulator, checked for memory against the cap, round-trip through
JSON, and applied by ``parallelize(step, plan=...)``, whose per-rank programs compute what
the single-device step computes.
"""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.cluster.hardware import load_cluster
from partita.planning import PlanError, model_shape, report_text
from partita.planning.bounds import stage_cut

GIB = 1024.0 ** 3


def tiny(batch: int = 8, dtype: str = "f32") -> partita.Graph:
    return partita.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128, batch=batch, dtype=dtype)


@pytest.fixture(scope="module")
def node():
    return load_cluster("selene").with_nodes(1)


@pytest.fixture(scope="module")
def tiny_plan(node):
    return partita.plan(tiny(), node, devices=4, price=2)


def test_model_shape_reads_the_transformer():
    s = model_shape(partita.models.gpt(layers=3, hidden=64, heads=4, seq=16, vocab=100, batch=2, dtype="bf16",
                                       attention="fused_softmax"))
    assert (s.batch, s.seq, s.layers, s.hidden, s.heads, s.vocab, s.ffn) == (2, 16, 3, 64, 4, 100, 256)
    assert not s.fused_attention


def test_plan_is_priced_and_explained(tiny_plan):
    p = tiny_plan
    assert p.step_time > 0 and p.devices == 4 and p.memory <= p.memory_cap
    assert p.recompute in ("none", "selective", "full")
    assert p.report["candidates"] >= p.report["within_cap"] >= p.report["priced"] >= 1
    text = report_text(p)
    assert text.startswith("chosen: ") and "rejected families:" in text


def test_json_round_trip(tiny_plan):
    q = partita.Plan.from_json(tiny_plan.to_json())
    assert q == tiny_plan
    with pytest.raises(PlanError, match="not a partita plan"):
        partita.Plan.from_json("{}")
    with pytest.raises(PlanError, match="unknown field 'meshes'"):
        partita.Plan.from_json('{"partita_plan": 1, "mesh": "dp=2", "strategy": "dp", "meshes": 1}')


def test_memory_cap_is_respected(node):
    free = partita.plan(tiny(), node, devices=4, price=2)
    cap = free.memory * 0.5
    p = partita.plan(tiny(), node, cap, devices=4, price=2)
    assert p.memory <= cap and p.memory_cap == cap


def test_nothing_fits_says_what_would(node):
    with pytest.raises(PlanError, match=r"smallest needs [\d.]+ GiB.*at least \d+ devices|smallest needs"):
        partita.plan(tiny(), node, "1MiB", devices=1, price=1)
    with pytest.raises(PlanError, match="no plan .* fits 0.0 GiB"):
        partita.plan(tiny(), node, 1024, devices=2, price=1)


def test_bad_inputs_are_clear(node):
    with pytest.raises(PlanError, match="devices=16, but cluster"):
        partita.plan(tiny(), node, devices=16)
    with pytest.raises(PlanError, match="global_batch=4"):
        partita.plan(tiny(), node, devices=2, global_batch=4)
    with pytest.raises(partita.PartitaError):
        partita.plan(tiny(), "no-such-cluster", devices=2)
    odd = partita.models.gpt(layers=2, hidden=48, heads=3, seq=8, vocab=64, batch=3, dtype="f32")
    with pytest.raises(PlanError, match="factor into no valid mesh"):
        partita.plan(odd, node, devices=8)


def test_stage_cut_balances_equal_layers_and_offloads_the_head():
    assert stage_cut([1.0] * 8, 4) == [2, 2, 2, 2]
    assert stage_cut([1.0] * 8, 2, last_extra=2.0) == [5, 3]


def test_parallelize_with_the_plan_matches_one_device(tiny_plan):
    from partita.autodiff.optim import initial_state

    p = tiny_plan
    step = p.training_step(tiny())
    prog = partita.parallelize(step, plan=p)
    rng = np.random.default_rng(0)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(v.type.dtype.np)
         for v in step.inputs if v.role == "param"}
    full = dict(w, **{str(v.name): initial_state(str(v.name), v.type, w) for v in step.inputs if v.role == "state"})
    feed = {"ids": rng.integers(0, 128, (8, 16)), "target": rng.integers(0, 128, (8, 16))}
    for v, a, b in zip(step.outputs, prog.simulate(feed, full), partita.run(step, feed, full)):
        # Adam's update divides by the gradient's root mean square: a few elements amplify rounding.
        err = np.linalg.norm(np.float64(a) - np.float64(b)) / max(np.linalg.norm(np.float64(b)), 1e-6)
        assert err < 1e-4, f"%{v.name} differs by {err:.2e}"


def test_parallelize_refuses_a_plan_with_a_mesh(tiny_plan):
    from partita.parallel.strategies import StrategyError

    with pytest.raises(StrategyError, match="pass plan= alone"):
        partita.parallelize(tiny_plan.training_step(tiny()), "dp=4", plan=tiny_plan)
    with pytest.raises(StrategyError, match="must be a partita.Plan"):
        partita.parallelize(tiny_plan.training_step(tiny()), plan="dp=4")


@pytest.mark.parametrize("recompute,schedule,virtual", [("none", "1f1b", 1), ("full", "1f1b", 1),
                                                        ("selective", "interleaved", 2)])
def test_memory_bound_covers_the_pipeline_ranks_peak(recompute, schedule, virtual):
    """A pipeline's memory is predicted by the bound alone (its section-level simulation has no
    per-rank report): the bound is at least each unrolled rank's measured peak."""
    from partita.cluster import memory_report
    from partita.planning.bounds import Candidate, memory_bytes

    fwd = partita.models.gpt(layers=4, hidden=128, heads=4, seq=128, vocab=1024, batch=16, dtype="bf16",
                             attention="fused_softmax", dropout=0.1)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True,
                                 recompute=recompute)
    prog = partita.parallelize(step, mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4, schedule=schedule,
                               virtual_stages=virtual)
    peak = max(memory_report(g).peak for g in {id(g): g for g in prog.rank_graphs()}.values())
    bound = memory_bytes(model_shape(fwd), Candidate(2, 2, 1, "dp", False, 2, 4, schedule, virtual, recompute))
    assert bound >= peak, (bound, peak)


def test_a_pipeline_plan_with_its_cut_matches_one_device():
    """A pipelined plan (stage cut, microbatches, schedule, recompute) read back from JSON and
    applied by parallelize(plan=) computes what the single-device step computes."""
    from partita.autodiff.optim import initial_state

    p = partita.Plan(mesh="pp=2,dp=2", strategy="pp+dp", recompute="selective", microbatches=2, schedule="1f1b",
                     stages=[3, 1], devices=4)
    p = partita.Plan.from_json(p.to_json())
    step = p.training_step(tiny())
    prog = partita.parallelize(step, plan=p)
    rng = np.random.default_rng(1)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(v.type.dtype.np)
         for v in step.inputs if v.role == "param"}
    full = dict(w, **{str(v.name): initial_state(str(v.name), v.type, w) for v in step.inputs if v.role == "state"})
    feed = {"ids": rng.integers(0, 128, (8, 16)), "target": rng.integers(0, 128, (8, 16))}
    for v, a, b in zip(step.outputs, prog.simulate(feed, full), partita.run(step, feed, full)):
        # Adam's update divides by the gradient's root mean square: a few elements amplify rounding.
        err = np.linalg.norm(np.float64(a) - np.float64(b)) / max(np.linalg.norm(np.float64(b)), 1e-6)
        assert err < 1e-4, f"%{v.name} differs by {err:.2e}"


def test_a_training_step_is_planned_with_its_own_recomputation(node):
    step = partita.training_step(tiny(), loss="cross_entropy", optimizer="adamw")
    p = partita.plan(step, node, devices=2, price=1)
    assert p.recompute == "none" and p.step_time > 0
    assert partita.parallelize(step, plan=p) is not None


def test_the_report_names_the_ops_replicated_for_lack_of_a_sharding_rule(node, monkeypatch):
    """An op without a sharding rule is replicated whatever the plan, and the report says which
    and why: the GPT's position iota (a documented reason), and an op whose rule is taken away
    (as a user's op registered without one would be)."""
    from partita.parallel import sharding
    from partita.planning.planner import report_text

    p = partita.plan(tiny(), node, devices=2, price=1)
    assert any(" = iota" in x and "global positions" in x for x in p.report["replicated"]), p.report
    assert "replicated (no sharding rule):" in report_text(p)

    from partita.planning.planner import replicated_for_lack_of_rule
    real = sharding.sharding_spec
    monkeypatch.setattr(sharding, "sharding_spec",
                        lambda op, types, attrs: None if op == "matmul" else real(op, types, attrs))
    lines = replicated_for_lack_of_rule(tiny())
    soft = [x for x in lines if " = matmul" in x]
    assert soft and "every rank computes it whole" in soft[0]
