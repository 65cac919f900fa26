"""bench/bench_ground_truth.py --planner: the planner's plan among the candidates, and each rank's
peak memory measured (partita/runtime/memory_peak.py) beside ``memory_report``'s. No timings."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

import partita
from partita.cluster.hardware import load_cluster
from partita.planning.plan import Plan
from partita.runtime.memory_peak import ENV, memory_dir, resident_bytes

ROOT = Path(__file__).resolve().parents[2]


def bench():
    """The bench script as a module."""
    spec = importlib.util.spec_from_file_location("bench_ground_truth_t", ROOT / "bench" / "bench_ground_truth.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiny_step(batch: int = 8) -> partita.Graph:
    fwd = partita.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=batch, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


def test_map_plan_finds_the_six_and_nothing_else():
    b = bench()
    assert b.map_plan(Plan(mesh="dp=4", strategy="dp"), b.PLANS) == "dp4"
    assert b.map_plan(Plan(mesh="tp=4", strategy="megatron"), b.PLANS) == "tp4"
    assert b.map_plan(Plan(mesh="dp=4", strategy="zero3"), b.PLANS) == "zero3"
    assert b.map_plan(Plan(mesh="dp=2,tp=2", strategy="megatron+dp"), b.PLANS) == "dp2xtp2"
    pp = Plan(mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4, schedule="1f1b", stages=[2, 2])
    assert b.map_plan(pp, b.PLANS) == "pp2xdp2"
    # Other microbatches, schedules, uneven cuts, sp, recomputation or placements: none of the six.
    others = [Plan(mesh="pp=2,dp=2", strategy="pp+dp", microbatches=8, schedule="interleaved", virtual_stages=2),
              Plan(mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4, schedule="1f1b", stages=[3, 1]),
              Plan(mesh="dp=2,tp=2", strategy="dp+megatron+sp"),
              Plan(mesh="tp=2,dp=2", strategy="dp+megatron"),
              Plan(mesh="dp=4", strategy="dp", recompute="full"),
              Plan(mesh="tp=4", strategy="", sharding="milp", annotations={"x": "[-, tp]"})]
    for p in others:
        assert b.map_plan(p, b.PLANS) is None, p.describe()


def test_planner_candidates_hold_the_planners_plan():
    b = bench()
    step = tiny_step()
    name, plan, progs = b.planner_candidates(step, load_cluster("selene").with_nodes(1), None, list(b.PLANS))
    assert name in progs
    assert set(b.PLANS) <= set(progs)
    if b.map_plan(plan, b.PLANS) is None:
        assert name == b.PLANNER and len(progs) == len(b.PLANS) + 1
    else:
        assert name == b.map_plan(plan, b.PLANS) and len(progs) == len(b.PLANS)


def test_resident_bytes_counts_each_storage_once():
    import torch

    t = torch.zeros(10, 4)
    a = np.zeros((3, 5), np.float32)
    assert resident_bytes({"t": t, "view": t[2:], "a": a, "same": a, "n": 3}) == 160 + 60


def test_measuring_is_off_by_default(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert memory_dir() is None


@pytest.mark.timeout(300)
def test_measured_peak_per_rank_is_near_memory_report(monkeypatch):
    """A 2-rank dp run: each rank's measured peak is positive and within a loose bound of its
    ``memory_report`` peak (the bench holds the real figures to 15%)."""
    b = bench()
    monkeypatch.delenv(ENV, raising=False)
    step = tiny_step()
    prog = partita.parallelize(step, mesh="dp=2", strategy="dp")
    rng = np.random.default_rng(0)
    weights = {str(v.name): (rng.standard_normal(v.type.shape) * 0.02).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    feed = {"ids": rng.integers(0, 128, (8, 16)), "target": rng.integers(0, 128, (8, 16))}
    got = b.measure_memory(prog, feed, weights, steps=2)
    pred = b.predicted_peaks(prog, load_cluster("selene").with_nodes(1))
    assert len(got) == len(pred) == 2
    for m, p in zip(got, pred):
        assert m > 0 and p > 0
        assert 0.5 < m / p < 2.0, (m, p)
    assert ENV not in os.environ
