"""Alike pipeline sections priced once (partita/parallel/pipeline/chunk_templates.py): the
section simulator hands a fragment built for one section to every section alike but for
names, within a candidate and, with a ``SectionCache``, across candidates (the planner's
``Pricer`` keeps one). The priced step must be the one each section built apart gives."""

from __future__ import annotations

import pytest

import partita
from partita.cluster import pipeline_sim
from partita.cluster.hardware import load_cluster
from partita.cluster.simulator import simulate
from partita.parallel.pipeline.chunk_templates import SectionCache, section_digest, using_section_cache

CANDIDATES = [
    dict(mesh="pp=2,dp=2", strategy="pp+dp", schedule="1f1b", virtual_stages=1, microbatches=4),
    dict(mesh="pp=2,dp=4", strategy="pp+dp", schedule="interleaved", virtual_stages=2, microbatches=2),
    dict(mesh="pp=2,dp=2", strategy="pp+zero1", schedule="interleaved", virtual_stages=2, microbatches=4),
    dict(mesh="pp=4,dp=2", strategy="pp+dp", schedule="1f1b", virtual_stages=1, microbatches=8),
    dict(mesh="pp=2,dp=2,tp=2", strategy="pp+dp+megatron+sp", schedule="interleaved", virtual_stages=2,
         microbatches=4),
]


@pytest.fixture(scope="module")
def step() -> partita.Graph:
    fwd = partita.models.gpt(layers=8, hidden=64, heads=4, seq=16, vocab=128, batch=16, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


@pytest.fixture(scope="module")
def programs(step):
    return [partita.parallelize(step, unroll=False, **kw) for kw in CANDIDATES]


def each_section_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """No two sections alike: every fragment built for its own section, as before the cache."""
    monkeypatch.setattr(pipeline_sim, "section_digest", lambda *a: object())


def test_alike_sections_give_the_step_each_built_apart_gives(programs, monkeypatch):
    cl = load_cluster("selene").with_nodes(2)
    shared = [simulate(p, cl, trace=False) for p in programs]
    cache = SectionCache()
    with using_section_cache(cache):
        kept = [simulate(p, cl, trace=False) for p in programs]
    assert cache.hits > cache.built > 0          # most sections are alike
    each_section_apart(monkeypatch)
    apart = [simulate(p, cl, trace=False) for p in programs]
    for a, b, c in zip(apart, shared, kept):
        assert b.step_time == pytest.approx(a.step_time, rel=1e-12)
        assert c.step_time == pytest.approx(a.step_time, rel=1e-12)
        assert c.hardware_flops == pytest.approx(a.hardware_flops, rel=1e-12)
        assert c.comm_bytes == pytest.approx(a.comm_bytes, rel=1e-12)


def test_the_digest_ignores_names_and_the_dp_group_size(programs):
    """The middle chunks' forward sections on two dp sizes share a digest; a tp section does not."""
    def digests(prog) -> set[tuple]:
        out = set()
        for t in prog.templates:
            by: dict[tuple, list] = {}
            for n in t.local.nodes:
                by.setdefault(t.sections[n], []).append(n)
            outs = set(t.local.outputs)
            out |= {section_digest(ns, outs, True) for k, ns in by.items() if k[0] == "F"}
        return out

    assert digests(programs[1]) & digests(programs[2])
    assert not digests(programs[0]) & digests(programs[4])
