"""The step-time floor (partita/planning/floor.py) that skips a mesh unpriced: never above the
simulated step, for pipelines (1F1B with its cut, interleaved), tensor and data parallelism,
zero3 and each recomputation, with the scores materialized and with fused attention."""

from __future__ import annotations

import pytest

import partita
from partita.cluster.hardware import load_cluster
from partita.planning import model_shape
from partita.planning.bounds import Candidate
from partita.planning.floor import layer_costs, step_floor
from partita.planning.search import Pricer, candidate_plan

CANDIDATES = [
    Candidate(2, 2, 2, "dp", True, 2, 4, "1f1b", 1, "none"),
    Candidate(2, 4, 1, "zero1", False, 1, 4, "interleaved", 4, "full"),
    Candidate(4, 1, 2, "dp", True, 4, 4, "1f1b", 1, "selective"),
    Candidate(4, 2, 1, "dp", False, 1, 8, "interleaved", 2, "none"),
    Candidate(1, 4, 2, "zero3", True, 4, 1, None, 1, "none"),
    Candidate(1, 8, 1, "dp", False, 2, 1, None, 1, "full"),
]


@pytest.mark.parametrize("attention", ["fused_softmax", "flash"])
def test_floor_is_below_the_simulated_step(attention):
    kw = {"attention": attention} if attention != "flash" else {}
    fwd = partita.models.gpt(layers=8, hidden=512, heads=8, seq=512, vocab=2048, batch=16, dtype="bf16", **kw)
    cluster = load_cluster("selene").with_nodes(1)
    shape = model_shape(fwd)
    costs = layer_costs(fwd, cluster, shape.layers)
    assert costs is not None and costs.layer > 0 and costs.head > 0
    pricer = Pricer(fwd, cluster, False, {"loss": "cross_entropy", "optimizer": "adamw", "master_weights": True})
    for c in CANDIDATES:
        p = candidate_plan(shape, c, 8, cluster)
        simulated, _, _ = pricer.price(p)
        assert 0 < step_floor(costs, shape, c, p.stages) <= simulated, p.describe()


def test_no_floor_without_alike_layers():
    fwd = partita.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=4, dtype="bf16")
    assert layer_costs(fwd, load_cluster("selene"), 3) is None
    assert layer_costs(fwd, load_cluster("selene"), 2) is not None


def test_the_floor_keeps_the_plan_the_simulator_chooses(monkeypatch):
    """Planning with the floor chooses what planning without it chooses (the floor only skips
    meshes that cannot win)."""
    import partita.planning.planner as planner

    fwd = partita.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="bf16")
    cluster = load_cluster("selene").with_nodes(1)
    with_floor = partita.plan(fwd, cluster, devices=4, price=4)
    monkeypatch.setattr(planner, "layer_costs", lambda *a, **k: None)
    without = partita.plan(fwd, cluster, devices=4, price=4)
    assert with_floor.describe() == without.describe()
    assert with_floor.step_time == without.step_time
