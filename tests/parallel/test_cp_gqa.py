"""``cp`` and ``cp-ring`` on grouped-query attention (4 query heads, 2 k/v heads): the k/v
heads cross the ``cp`` axis before they are repeated (all-gathered, or handed around the
ring), their gradients are summed over the repeated heads before they go back, in the
builder's spelling of the repeat and in the import's spelling of ``x.repeat`` (a tile);
every step checked against the single-device step on ``run_mesh``, alone, with megatron and
under a pipeline, and the plan's bytes are the k/v heads' bytes."""

from __future__ import annotations

import importlib

import pytest

import partita
from partita.ir.builder import Builder
from partita.ir.graph import Graph, Value
from partita.parallel.strategy import parallelize

from test_cp import SEQ, cp_step, feed_and_weights, worst_error

HD = 8   # head dim of the tiny Llama (hidden 32, 4 heads)


def tiled_repeat(b: Builder, x: Value, rep: int, batch: int, kv_heads: int, seq: int, hd: int) -> Value:
    """The import's spelling of ``x.repeat(1, rep, 1, 1)``: a reshape to [B, 1, kv, S, E], a
    broadcast and a reshape (head h reads k/v head h % kv)."""
    y = b.reshape(x, shape=(batch, 1, kv_heads, seq, hd))
    y = b.broadcast_to(y, shape=(batch, rep, kv_heads, seq, hd))
    return b.reshape(y, shape=(batch, rep * kv_heads, seq, hd))


def gqa_step(spelling: str, monkeypatch: pytest.MonkeyPatch) -> Graph:
    """The tiny GQA Llama step with the repeat of its k/v heads spelled as the builder or the
    import spells it."""
    if spelling == "tile":
        monkeypatch.setattr(importlib.import_module("partita.models.llama"), "_repeat_kv", tiled_repeat)
    return cp_step("llama")


CASES = [("cp=2", "cp", {}, 2), ("cp=2,tp=2", "cp+megatron", {}, 1),
         ("pp=2,cp=2", "pp+cp", {"microbatches": 2}, 2), ("cp=2", "cp-ring", {}, 2),
         ("cp=2,tp=2", "cp-ring+megatron", {}, 1), ("pp=2,cp=2", "pp+cp-ring", {"microbatches": 2}, 2)]


@pytest.mark.parametrize("spelling", ["builder", "tile"])
@pytest.mark.parametrize("mesh,strategy,kw,kv", CASES)
def test_cp_moves_the_kv_heads_and_matches_one_device(spelling, mesh, strategy, kw, kv, monkeypatch):
    """Every cp collective of k, v and their gradients carries the rank's k/v heads ([B, kv,
    tokens, E]: kv = 2, 1 under megatron), never the repeated query heads; the step equals
    one device's. (Tiled, each tp rank's two query heads read both k/v heads, so megatron
    keeps both on every rank: the rank's repeat is no repeat.)"""
    step = gqa_step(spelling, monkeypatch)
    kv = kv if spelling == "builder" else 2
    prog = parallelize(step, mesh, strategy, **kw)
    b = 4 // kw.get("microbatches", 1)   # a microbatch's rows under the pipeline
    moved = 0
    for g in (prog.rank_graphs() if hasattr(prog, "rank_graphs") else [prog.local]):
        for n in g.nodes:
            if n.op in ("all_gather", "reduce_scatter", "ring_shift") and n.attrs["axis"] == "cp" \
                    and n.operands[0].type.rank == 4:
                assert n.operands[0].type.shape[:2] == (b, kv), f"{n.op} of {n.operands[0].type}"
                moved += 1
    assert moved
    if "ring" not in strategy and hasattr(prog.plan, "collectives"):   # a pipeline plan lists its stages'
        gathers = [c for c in prog.plan.collectives if c["op"] == "all_gather" and c["axis"] == "cp"]
        assert gathers and all(c["bytes"] == b * kv * (SEQ // 2) * HD * 4 for c in gathers)
    feed, weights = feed_and_weights(step)
    err, name = worst_error(step, prog, feed, weights)
    assert err <= 1e-4, f"{strategy} on {mesh} ({spelling}): %{name} differs from one device by {err:.2e}"


def test_cp_ring_shifts_the_kv_heads():
    """Ring attention hands the 2 k/v heads (and their gradients, summed over the repeated
    heads) around the ring, half the bytes of the 4 repeated heads."""
    prog = parallelize(cp_step("llama"), "cp=4", "cp-ring")
    shifts = [n for n in prog.local.nodes if n.op == "ring_shift" and n.operands[0].type.rank == 4]
    assert shifts and all(n.operands[0].type.shape == (4, 2, SEQ // 4, HD) for n in shifts)
    for n in prog.local.nodes:
        if n.op == "attention":
            assert n.operands[1].type.shape == (4, 4, SEQ // 4, HD)
