"""The planner's hybrid sharding (hsdp) and context-parallel (cp) candidates: enumerated where they
apply and not otherwise, priced and explained like the others, and a plan of either family runs on
``run_mesh`` as the single-device step does."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.autodiff.optim import initial_state
from partita.cluster.hardware import load_cluster
from partita.ir import Graph
from partita.planning import Plan, model_shape, report_text
from partita.planning.bounds import Candidate, memory_bytes, time_parts
from partita.planning.search import candidate_plan, cp_candidates, cp_reason, enumerate_candidates
from partita.parallel.strategy import StrategyError, parallelize

RECOMPUTES = ("none", "selective", "full")


def gpt(seq: int = 16, batch: int = 16, layers: int = 2, hidden: int = 32, heads: int = 4, vocab: int = 64,
        dtype: str = "f32", attention: str = "fused") -> Graph:
    return partita.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, batch=batch,
                              dtype=dtype, attention=attention)


def two_nodes():
    return load_cluster("selene").with_nodes(2)


def test_hsdp_is_enumerated_only_where_dp_spans_more_than_a_node_group():
    shape = model_shape(gpt())
    cands, _ = enumerate_candidates(shape, two_nodes(), 16, ("none",))
    hsdp = [c for c in cands if c.zero == "hsdp"]
    assert hsdp and all(c.pp == 1 and c.dp > c.fsdp and c.dp % c.fsdp == 0 and c.fsdp * c.tp == 8 for c in hsdp)
    assert {(c.dp, c.fsdp, c.tp) for c in hsdp} == {(16, 8, 1), (8, 4, 2), (4, 2, 4)}
    one_node, _ = enumerate_candidates(shape, two_nodes(), 8, ("none",))
    assert not any(c.zero == "hsdp" for c in one_node)
    p = candidate_plan(shape, next(c for c in hsdp if c.tp == 2), 16, two_nodes())
    assert (p.mesh, p.strategy) == ("dp=2,fsdp=4,tp=2", "hsdp+megatron")


def test_hsdp_shards_states_over_the_group_and_moves_less_across_nodes():
    shape = model_shape(gpt(hidden=256, heads=8, seq=128, vocab=512, batch=32, dtype="bf16"))
    cl = two_nodes()
    z3 = Candidate(1, 16, 1, "zero3", False, 2, 1, None, 1, "none")
    hs = Candidate(1, 16, 1, "hsdp", False, 2, 1, None, 1, "none", fsdp=8)
    assert memory_bytes(shape, z3) < memory_bytes(shape, hs)      # 1/16 of the states against 1/8
    assert time_parts(shape, hs, cl)["dp"] < time_parts(shape, z3, cl)["dp"]


def test_cp_is_searched_for_long_sequences_or_when_nothing_fits_without_it():
    assert cp_reason(model_shape(gpt(seq=16384, batch=4)), True) is None
    assert "under 16384" in (cp_reason(model_shape(gpt()), True) or "")
    assert cp_reason(model_shape(gpt()), False) is None  # nothing fits without it
    assert "fused attention" in (cp_reason(model_shape(gpt(attention="eager")), False) or "")
    shape = model_shape(gpt(seq=24, batch=4))
    cands = cp_candidates(shape, two_nodes(), 16, RECOMPUTES)
    assert cands and all(shape.seq % (2 * c.cp) == 0 and not c.sp for c in cands)
    assert {c.cp for c in cands} == {2, 4}                      # 2 x 8 does not divide 24
    assert all(c.zero != "zero3" for c in cands if c.pp > 1)
    p = candidate_plan(shape, next(c for c in cands if c.pp == 2 and c.dp == 2 and c.tp == 2 and c.cp == 2), 16,
                       two_nodes())
    assert p.mesh == "pp=2,dp=2,cp=2,tp=2" and p.strategy.startswith("pp+") and "+cp+megatron" in p.strategy


def test_short_sequence_plan_says_why_cp_and_hsdp_were_not_searched():
    p = partita.plan(gpt(batch=8), load_cluster("selene").with_nodes(1), devices=4, price=1)
    fams = p.report["families"]
    assert "not searched" in fams["cp"] and "under 16384" in fams["cp"]
    assert "not searched" in fams["hsdp"]
    assert "cp: not searched" in report_text(p)


@pytest.fixture(scope="module")
def hsdp_plan() -> Plan:
    g = gpt(layers=4, hidden=256, heads=8, seq=1024, vocab=512, batch=32, dtype="bf16")
    return partita.plan(g, two_nodes(), devices=16, price=2)


def test_planner_chooses_hsdp_where_zero3_traffic_crosses_nodes(hsdp_plan):
    assert hsdp_plan.strategy.startswith("hsdp") and "fsdp=" in hsdp_plan.mesh
    assert hsdp_plan.report["families"]["hsdp"].startswith("won")
    assert hsdp_plan.memory is not None and hsdp_plan.memory <= (hsdp_plan.memory_cap or 0)


def test_long_sequence_plan_reports_cp():
    g = gpt(layers=4, hidden=256, heads=8, seq=16384, vocab=512, batch=4, dtype="bf16")
    p = partita.plan(g, two_nodes(), devices=16, price=2)
    why = p.report["families"]["cp"]
    assert why.startswith(("won", "lost")) and ("because of" in why or why.startswith("won"))


def feed_and_weights(step: Graph, batch: int, seq: int) -> tuple[dict, dict]:
    rng = np.random.default_rng(0)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(v.type.dtype.np)
         for v in step.inputs if v.role == "param"}
    full = dict(w, **{str(v.name): initial_state(str(v.name), v.type, w) for v in step.inputs if v.role == "state"})
    feed = {str(step.inputs[0].name): rng.integers(0, 64, (batch, seq)), "target": rng.integers(0, 64, (batch, seq))}
    return feed, full


def worst_error(step: Graph, p: Plan, batch: int, seq: int) -> float:
    """The largest relative difference of the plan's outputs on ``run_mesh`` from the single device's."""
    feed, weights = feed_and_weights(step, batch, seq)
    prog = parallelize(step, **p.parallelize_options())
    worst = 0.0
    for a, b in zip(prog.simulate(feed, weights), partita.run(step, feed, weights)):
        a64, b64 = np.float64(a), np.float64(b)
        worst = max(worst, float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-4)))
    return worst


def test_chosen_hsdp_plan_runs_like_one_device(hsdp_plan):
    step = partita.training_step(gpt(), loss="cross_entropy", optimizer="adamw")
    p = Plan(mesh=hsdp_plan.mesh, strategy=hsdp_plan.strategy, devices=16)
    assert worst_error(step, p, 16, 16) < 1e-4


@pytest.mark.parametrize("pick", [
    lambda c: c.pp == 1 and c.dp == 1 and c.tp == 1 and c.cp == 4 and c.zero == "dp",
    lambda c: c.pp == 1 and c.dp == 2 and c.tp == 1 and c.cp == 2 and c.zero == "zero3",
    lambda c: c.pp == 1 and c.dp == 1 and c.tp == 2 and c.cp == 2,
])
def test_cp_candidate_plans_run_like_one_device(pick):
    fwd = gpt(batch=4)
    shape = model_shape(fwd)
    c = next(c for c in cp_candidates(shape, load_cluster("selene").with_nodes(1), 4, ("none",)) if pick(c))
    p = candidate_plan(shape, c, 4, load_cluster("selene").with_nodes(1))
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    assert worst_error(step, p, 4, 16) < 1e-4, p.describe()


def test_cp_that_does_not_divide_the_sequence_is_a_clear_error():
    step = partita.training_step(gpt(seq=12, batch=4), loss="cross_entropy", optimizer="adamw")
    with pytest.raises(StrategyError, match=r"not a multiple of 2 x cp = 8.*smaller 'cp' axis"):
        parallelize(step, **Plan(mesh="cp=4", strategy="cp", devices=4).parallelize_options())
    assert cp_candidates(model_shape(gpt(seq=12, batch=4)), load_cluster("selene").with_nodes(1), 4,
                         ("none",)) and all(c.cp == 2 for c in cp_candidates(
                             model_shape(gpt(seq=12, batch=4)), load_cluster("selene").with_nodes(1), 4, ("none",)))
