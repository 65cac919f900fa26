"""The search's pieces: zero3 in the enumeration (no pipeline), its memory bound, and the
candidates not priced because a twin with less recomputation fits."""

from __future__ import annotations

import dataclasses

import partita
from partita.cluster.hardware import load_cluster
from partita.planning import model_shape
from partita.planning.bounds import Candidate, memory_bytes
from partita.planning.planner import dominated
from partita.planning.search import dp_kinds, enumerate_candidates


def shape():
    return model_shape(partita.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128, batch=8, dtype="bf16"))


def test_zero3_is_enumerated_without_a_pipeline_only():
    assert dp_kinds(1, 4) == ("dp", "zero1", "zero3")
    assert dp_kinds(2, 4) == ("dp", "zero1") and dp_kinds(1, 1) == ("dp",)
    cands, _ = enumerate_candidates(shape(), load_cluster("selene").with_nodes(1), 8, ("none",))
    assert any(c.zero == "zero3" for c in cands)
    assert all(c.pp == 1 for c in cands if c.zero == "zero3")


def test_zero3_shards_every_state():
    base = Candidate(1, 4, 1, "dp", False, 2, 1, None, 1, "none")
    s = shape()
    dp, z1, z3 = (memory_bytes(s, dataclasses.replace(base, zero=z)) for z in ("dp", "zero1", "zero3"))
    assert z3 < z1 < dp


def test_more_recomputation_is_not_priced_when_less_fits():
    c = Candidate(2, 2, 1, "dp", False, 1, 4, "1f1b", 1, "selective")
    light = dataclasses.replace(c, recompute="none")
    assert dominated(c, {c, light}) and not dominated(c, {c}) and not dominated(light, {c, light})
