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
