"""The planner's Pricer keeps one SectionCache (partita/parallel/pipeline/chunk_templates.py)
across its candidates: the alike pipeline sections are priced once, and every candidate's
priced step is what pricing each section apart gives (within 0.1%; equal in practice)."""

from __future__ import annotations

import pytest

import partita
from partita.cluster import pipeline_sim
from partita.cluster.hardware import load_cluster
from partita.planning import Plan
from partita.planning.search import Pricer


def gpt8() -> partita.Graph:
    return partita.models.gpt(layers=8, hidden=64, heads=4, seq=16, vocab=128, batch=16, dtype="f32")


PLANS = [Plan(mesh="pp=2,dp=4", strategy="pp+dp", microbatches=4, schedule="interleaved", virtual_stages=2, devices=8),
         Plan(mesh="pp=2,dp=2,tp=2", strategy="pp+zero1+megatron+sp", microbatches=4, schedule="interleaved",
              virtual_stages=4, devices=8),
         Plan(mesh="pp=4,dp=2", strategy="pp+dp", microbatches=8, schedule="1f1b", devices=8),
         Plan(mesh="pp=2,dp=4", strategy="pp+zero1", recompute="selective", microbatches=2, schedule="1f1b",
              devices=8)]


def test_each_candidate_priced_with_the_cache_as_apart(monkeypatch):
    node = load_cluster("selene").with_nodes(1)
    pricer = Pricer(gpt8(), node, False, {"loss": "cross_entropy", "optimizer": "adamw"})
    kept = [pricer.price(p)[0] for p in PLANS]
    assert pricer.sections.hits > pricer.sections.built
    monkeypatch.setattr(pipeline_sim, "section_digest", lambda *a: object())
    apart = [Pricer(gpt8(), node, False, {"loss": "cross_entropy", "optimizer": "adamw"}).price(p)[0] for p in PLANS]
    assert kept == pytest.approx(apart, rel=1e-3)


def test_a_planner_prices_what_it_priced_without_the_cache(monkeypatch):
    """Planning with the cache chooses what planning with every section priced apart chooses, at the same step."""
    fwd = gpt8()
    node = load_cluster("selene").with_nodes(1)
    a = partita.plan(fwd, node, devices=8, price=3)
    monkeypatch.setattr(pipeline_sim, "section_digest", lambda *a: object())
    b = partita.plan(fwd, node, devices=8, price=3)
    assert a.describe() == b.describe()
    assert a.step_time == pytest.approx(b.step_time, rel=1e-3)
    assert [r["step_s"] for r in a.report["next"]] == pytest.approx([r["step_s"] for r in b.report["next"]],
                                                                         rel=1e-3)
