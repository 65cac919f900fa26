"""Alike pipeline chunks built once (partita/parallel/pipeline/chunk_templates.py,
``chunk_programs``): each copy prints as the chunk built on its own does, with the same
parts (F, B, W), inputs and outputs, under each recomputation policy."""

from __future__ import annotations

import pytest

import partita
from partita.ir.printer import print_graph
from partita.parallel.pipeline.build import forward_of, microbatch_graph
from partita.parallel.pipeline.chunk_templates import chunk_digest, chunk_programs
from partita.parallel.pipeline.stage_graphs import build_chunk_program
from partita.parallel.pipeline.stages import partition_stages


def positions(cp, nodes) -> list[int]:
    order = {n: i for i, n in enumerate(cp.graph.nodes)}
    return [order[n] for n in nodes]


def values(cp, vals) -> list[int | None]:
    where = {v: i for i, v in enumerate(cp.graph.values())}
    return [None if v is None else where[v] for v in vals]


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("chunks,M", [(8, 4), (4, 2)])
def test_each_copied_chunk_is_the_chunk_built_alone(recompute, chunks, M):
    fwd = partita.models.gpt(layers=8, hidden=32, heads=4, seq=8, vocab=64, batch=8, dtype="f32", dropout=0.1)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", recompute=recompute)
    f, training = forward_of(step)
    mbg = microbatch_graph(f, M, training)
    sc = partition_stages(mbg.graph, chunks, None, virtual=2)
    last = chunks - 1
    got = chunk_programs(sc.chunks, mbg.loss, forward_only=False, outputs=None, recompute=recompute)
    alike = {chunk_digest(ch, ch.index == last) for ch in sc.chunks}
    assert len(alike) == 3                      # first, middle, last
    for ch, cp in zip(sc.chunks, got):
        ref = build_chunk_program(ch, ch.index == last, mbg.loss if ch.index == last else None,
                                  forward_only=False, outputs=None, recompute=recompute)
        assert print_graph(cp.graph) == print_graph(ref.graph)
        assert cp.index == ref.index and list(cp.params) == list(ref.params) and list(cp.batch) == list(ref.batch)
        assert list(cp.param_grads) == list(ref.param_grads)
        for part in ("F", "B", "W"):
            assert positions(cp, getattr(cp, part)) == positions(ref, getattr(ref, part))
        for what in ("recv", "send", "cotangents", "recv_grads", "final"):
            assert values(cp, getattr(cp, what)) == values(ref, getattr(ref, what))
        assert values(cp, list(cp.params.values()) + list(cp.param_grads.values()) + [cp.loss]) == \
            values(ref, list(ref.params.values()) + list(ref.param_grads.values()) + [ref.loss])
