"""Causal attention priced as a flash kernel runs it (partita/ops/nn.py ``attention_pairs``):
the tiles above the diagonal are skipped in the forward and in the backward, the tiles it
crosses computed whole; non-causal attention and the bytes moved are unchanged."""

from __future__ import annotations

import pytest

import partita
from partita.cluster.cost import CostModel
from partita.ir.dtypes import bf16
from partita.ir.types import TensorType
from partita.ops.nn import FLASH_TILE, attention_pairs
from partita.ops.registry import OPS


def tiles_scored(tq: int, tk: int) -> int:
    """The pairs a causal flash kernel scores, tile by tile: each tile of query rows scores the
    key tiles up to the one holding its last row's last key."""
    b, total = FLASH_TILE, 0
    for r0 in range(0, tq, b):
        r1 = min(tq, r0 + b)
        total += (r1 - r0) * min(tk, -(-r1 // b) * b)
    return total


@pytest.mark.parametrize("tq,tk", [(5, 7), (128, 128), (129, 1000), (300, 300), (300, 200), (200, 300),
                                   (1000, 129), (2048, 2048)])
def test_causal_pairs_are_the_tiles_on_and_below_the_diagonal(tq, tk):
    q, k = TensorType((3, 2, tq, 16), bf16), TensorType((3, 2, tk, 16), bf16)
    assert attention_pairs(q, k, True) == 6 * tiles_scored(tq, tk)
    assert attention_pairs(q, k, False) == 6 * tq * tk


def test_causal_attention_costs_about_half_forward_and_backward():
    t = 8192
    q = TensorType((1, 4, t, 128), bf16)
    lse = TensorType((1, 4, t), partita.ir.dtypes.f32)
    full = t * t
    half = t * t / 2 + t * FLASH_TILE / 2           # the diagonal's tiles scored whole
    for causal, pairs in ((False, full), (True, half)):
        fwd = OPS["attention"].cost_of([q, q, q], [q, lse], {"scale": None, "causal": causal})
        bwd = OPS["attention_grad"].cost_of([q, q, q, q, q, lse], [q, q, q], {"scale": None, "causal": causal})
        assert fwd.flops == 4 * (2 * pairs * 256 + 5 * pairs)
        assert bwd.flops == 4 * (2 * pairs * (3 * 128 + 2 * 128) + 6 * pairs)
        # no scores: q, k, v read and out, lse written once each, causal or not
        assert fwd.bytes_read == 3 * q.nbytes and fwd.bytes_written == q.nbytes + lse.nbytes
    assert half / full == pytest.approx(0.5, abs=0.01)


def test_the_simulator_prices_a_causal_llamas_attention_at_about_half():
    fwd = partita.models.llama(1, 256, 2, 2048, 128, kv_heads=2, batch=1, dtype="bf16")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True)
    att = [n for n in step.nodes if n.op in ("attention", "attention_grad")]
    assert {n.op for n in att} == {"attention", "attention_grad"} and all(n.attrs["causal"] for n in att)
    cm = CostModel(partita.cluster.load_cluster("meta-h100-roce"))
    causal = [cm.compute_time(n).flops for n in att]
    for n in att:
        n.attrs["causal"] = False
    full = [cm.compute_time(n).flops for n in att]
    for c, f in zip(causal, full):
        assert c / f == pytest.approx(0.5 + FLASH_TILE / (2 * 2048))


def cp_attention_nodes(strategy: str, mesh: str, **kw) -> list:
    """The attention ops of every rank program of a tiny causal Llama under context parallelism."""
    fwd = partita.models.llama(2, 32, 4, 64, 64, kv_heads=2, batch=2, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    prog = partita.parallelize(step, mesh, strategy, **kw)
    templates = getattr(prog, "templates", None)
    graphs = [t.local for t in templates] if templates else [prog.local]
    return [n for g in graphs for n in g.nodes if n.op in ("attention", "attention_grad")]


@pytest.mark.parametrize("strategy,mesh,kw", [("cp", "cp=4", {}), ("cp-ring", "cp=4", {}),
                                              ("pp+cp", "pp=2,cp=2", {"microbatches": 2, "unroll": False})])
def test_context_parallel_attention_is_priced_causal_by_its_positions(strategy, mesh, kw):
    from partita.cluster.cost import position_causal, position_causal_share, price_key

    att = cp_attention_nodes(strategy, mesh, **kw)
    assert att and all(not n.attrs["causal"] and position_causal(n) for n in att)
    cm = CostModel(partita.cluster.load_cluster("dgx-h100"))
    for n in att:
        share = position_causal_share(n)
        assert 0.5 < share <= 1.0
        assert cm.compute_time(n).flops == int(cm.record_cost(n).flops * share)
        assert price_key(n)[-1] is True


def test_the_causal_share_of_a_balanced_cp_rank():
    """cp=4 over 8 chunks of c keys: rank 0 holds chunks 0 and 7, and its flash kernel scores
    (2 cp c^2 + c tile) of the 4 cp c^2 pairs, the share position_causal_share prices."""
    from partita.parallel.strategies.cp import balanced_positions

    cp, c = 4, 1024
    s = 2 * cp * c
    pos = balanced_positions(s, cp)
    for r in range(cp):
        scored = 0
        for chunk in (pos[r, :c], pos[r, c:]):     # c contiguous positions from chunk[0]
            scored += c * int(chunk[0]) + tiles_scored(c, c)
        assert scored / (2 * c * s) == pytest.approx(0.5 + FLASH_TILE / (2 * s))


def test_a_mask_that_is_not_positions_is_priced_whole():
    from partita.cluster.cost import position_causal

    g = partita.parse("""graph @g(%q: f32[1,2,8,4], %m: bool[8,8]) -> (f32[1,2,8,4]) {
      %o, %l = attention(%q, %q, %q, %m) : f32[1,2,8,4], f32[1,2,8]
      return %o
    }""")
    assert not position_causal(next(iter(g.nodes)))
