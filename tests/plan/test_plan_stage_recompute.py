"""Recomputation per pipeline stage: the pipeline builds each stage's backward with its own policy
(``parallelize(..., recompute=["full", "none"])``), checked on ``run_mesh`` against the single-device
step; the planner offers the cheapest per-stage assignment that fits, and zero3 beside a pipeline
where zero1 does not fit."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.autodiff.optim import initial_state
from partita.ir import Graph
from partita.parallel.pipeline.schedule import PipelineError
from partita.parallel.strategy import parallelize


def gpt(seq: int = 16, batch: int = 8, layers: int = 2, hidden: int = 32, heads: int = 4, vocab: int = 64) -> Graph:
    return partita.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, batch=batch,
                              dtype="f32", attention="fused")


def feed_and_weights(step: Graph, batch: int, seq: int) -> tuple[dict, dict]:
    """Random token ids and targets, and random weights with their optimizer state."""
    rng = np.random.default_rng(0)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(v.type.dtype.np)
         for v in step.inputs if v.role == "param"}
    full = dict(w, **{str(v.name): initial_state(str(v.name), v.type, w) for v in step.inputs if v.role == "state"})
    feed = {str(step.inputs[0].name): rng.integers(0, 64, (batch, seq)), "target": rng.integers(0, 64, (batch, seq))}
    return feed, full


def worst_error(step: Graph, batch: int, seq: int, **options) -> float:
    """The largest relative difference of the pipeline's outputs on ``run_mesh`` from the single device's."""
    feed, weights = feed_and_weights(step, batch, seq)
    prog = parallelize(step, **options)
    worst = 0.0
    for a, b in zip(prog.simulate(feed, weights), partita.run(step, feed, weights)):
        a64, b64 = np.float64(a), np.float64(b)
        worst = max(worst, float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-4)))
    return worst


@pytest.fixture(scope="module")
def step() -> Graph:
    return partita.training_step(gpt(), loss="cross_entropy", optimizer="adamw")


def test_stage_zero_full_stage_one_none_runs_like_one_device(step):
    opts = dict(mesh="pp=2", strategy="pp", microbatches=4, schedule="1f1b")
    assert worst_error(step, 8, 16, recompute=["full", "none"], **opts) < 1e-4
    assert worst_error(step, 8, 16, recompute=["none", "selective"], **opts) < 1e-4


def test_each_stage_gets_its_own_policy(step):
    from partita.autodiff.recompute import recomputed_nodes

    def counts(policies):
        prog = parallelize(step, mesh="pp=2", strategy="pp", microbatches=2, recompute=policies)
        return [len(recomputed_nodes(cp.graph)) for cp in prog.pipeline.chunks]

    mixed, none, full = counts(["full", "none"]), counts("none"), counts("full")
    assert none == [0, 0] and full[0] > 0 and full[1] > 0
    assert mixed == [full[0], 0]


def test_per_stage_recompute_bad_input(step):
    with pytest.raises(PipelineError, match="has 3 policies, but the pipeline has 2 stages"):
        parallelize(step, mesh="pp=2", strategy="pp", microbatches=2, recompute=["full", "none", "none"])
    with pytest.raises(PipelineError, match=r"recompute\[1\]"):
        parallelize(step, mesh="pp=2", strategy="pp", microbatches=2, recompute=["full", "fulll"])
    built = partita.training_step(gpt(), loss="cross_entropy", optimizer="adamw", recompute="full")
    with pytest.raises(PipelineError, match="per-stage policies need a step built without recomputation"):
        parallelize(built, mesh="pp=2", strategy="pp", microbatches=2, recompute=["full", "none"])


# --- the planner's memory family -------------------------------------------------------------

GIB = 2 ** 30


def mid_gpt() -> Graph:
    return partita.models.gpt(layers=8, hidden=1024, heads=16, seq=2048, vocab=512, batch=16, dtype="bf16",
                              attention="fused")


def one_node():
    from partita.cluster.hardware import load_cluster

    return load_cluster("selene").with_nodes(1)


def test_stage_recompute_candidates_are_the_least_stages_that_fit():
    import dataclasses

    from partita.planning import model_shape
    from partita.planning.bounds import memory_bytes
    from partita.planning.memory_family import stage_recompute_candidates
    from partita.planning.search import enumerate_candidates

    shape = model_shape(mid_gpt())
    cands, _ = enumerate_candidates(shape, one_node(), 8, ("none", "selective", "full"))
    mems = {c: memory_bytes(shape, c) for c in cands}
    cap = 0.8 * GIB
    got = stage_recompute_candidates(shape, cands, mems, cap, ("none", "selective", "full"))
    assert got
    for m in got:
        k = sum(r != "none" for r in m.stage_recompute)
        assert m.kind() == "memory" and m.schedule == "1f1b" and m.recompute == "none" and len(m.stage_recompute) == m.pp
        assert m.stage_recompute == (m.stage_recompute[0],) * k + ("none",) * (m.pp - k) and 0 < k < m.pp
        assert memory_bytes(shape, m) <= cap < mems[dataclasses.replace(m, stage_recompute=())]
        if k > 1:      # one stage fewer would not fit
            fewer = dataclasses.replace(m, stage_recompute=m.stage_recompute[:k - 1] + ("none",) * (m.pp - k + 1))
            assert memory_bytes(shape, fewer) > cap
    # The first stage holds the most microbatches: recomputing it saves more than recomputing the last.
    m = got[0]
    last = dataclasses.replace(m, stage_recompute=("none",) * (m.pp - 1) + ("full",))
    first = dataclasses.replace(m, stage_recompute=("full",) + ("none",) * (m.pp - 1))
    assert memory_bytes(shape, first) < memory_bytes(shape, last)
    assert stage_recompute_candidates(shape, cands, mems, cap, ("full",)) == []


def test_pipeline_zero3_only_where_zero1_does_not_fit():
    import dataclasses

    from partita.planning import model_shape
    from partita.planning.bounds import memory_bytes
    from partita.planning.memory_family import pipeline_zero3_candidates
    from partita.planning.search import candidate_plan, enumerate_candidates

    shape = model_shape(mid_gpt())
    cands, _ = enumerate_candidates(shape, one_node(), 8, ("none",))
    mems = {c: memory_bytes(shape, c) for c in cands}
    got = pipeline_zero3_candidates(shape, cands, mems, 0.6 * GIB)
    assert got and all(c.pp > 1 and c.zero == "zero3" and c.kind() == "memory" for c in got)
    for c in got:
        zero1 = dataclasses.replace(c, zero="zero1", saves_memory=False)
        assert mems[zero1] > 0.6 * GIB and memory_bytes(shape, c) < mems[zero1]
    assert pipeline_zero3_candidates(shape, cands, mems, 100 * GIB) == []
    assert "pp+zero3" in candidate_plan(shape, got[0], 8, one_node()).strategy


def test_stage_recompute_plan_round_trips_and_runs_like_one_device(step):
    from partita.planning import Plan, model_shape
    from partita.planning.bounds import Candidate
    from partita.planning.search import candidate_plan

    shape = model_shape(gpt())
    c = Candidate(2, 1, 1, "dp", False, 2, 4, "1f1b", 1, "none", stage_recompute=("full", "none"))
    p = Plan.from_json(candidate_plan(shape, c, 2, one_node()).to_json())
    assert p.stage_recompute == ["full", "none"] and "recompute=full,none" in p.describe()
    assert p.parallelize_options()["recompute"] == ["full", "none"]
    assert worst_error(step, 8, 16, **p.parallelize_options()) < 1e-4
    plain = candidate_plan(shape, Candidate(2, 1, 1, "dp", False, 2, 4, "1f1b", 1, "none"), 2, one_node())
    assert "stage_recompute" not in plain.to_json()
    from partita.planning.shape import PlanError

    bad = p.to_json().replace('"full"', '"fulll"')
    with pytest.raises(PlanError, match="'stage_recompute' must be a list"):
        Plan.from_json(bad)


def test_report_says_what_the_memory_family_did():
    p = partita.plan(mid_gpt(), one_node(), 0.8 * GIB, devices=8)
    why = p.report["families"]["memory"]
    assert why.startswith(("won", "lost")), why
    p = partita.plan(partita.models.gpt(layers=2, hidden=64, heads=4, seq=64, vocab=128, batch=8), one_node(),
                     devices=2)
    assert p.report["families"]["memory"].startswith("not searched")


def test_weighted_stage_cut_is_the_least_maximum():
    import itertools

    from partita.planning.bounds import weighted_stage_cut

    def load(cut, factors, extra):
        return max(n * f + (extra if k == len(cut) - 1 else 0.0) for k, (n, f) in enumerate(zip(cut, factors)))

    for layers, factors, extra in [(8, (4 / 3, 1.0, 1.0, 1.0), 0.5), (12, (4 / 3, 4 / 3, 1.0), 2.0),
                                   (7, (1.0, 1.0), 0.0), (10, (1.1, 4 / 3, 1.0, 1.0, 1.0), 1.7), (5, (1.0,) * 5, 3.0)]:
        cut = weighted_stage_cut(layers, factors, extra)
        assert sum(cut) == layers and min(cut) >= 1 and len(cut) == len(factors)
        every = [c for c in itertools.product(range(1, layers + 1), repeat=len(factors)) if sum(c) == layers]
        assert load(cut, factors, extra) == pytest.approx(min(load(c, factors, extra) for c in every))


def test_pipeline_zero3_estimate_gathers_the_params_every_microbatch():
    import dataclasses

    from partita.planning import model_shape
    from partita.planning.bounds import Candidate, time_parts

    shape, cl = model_shape(mid_gpt()), one_node()
    c = Candidate(2, 4, 1, "zero1", False, 1, 4, "1f1b", 1, "none")
    z = dataclasses.replace(c, zero="zero3", saves_memory=True)
    more = dataclasses.replace(z, micro=1, microbatches=8)
    assert time_parts(shape, z, cl)["dp"] > 3 * time_parts(shape, c, cl)["dp"]
    assert time_parts(shape, more, cl)["dp"] > time_parts(shape, z, cl)["dp"]
