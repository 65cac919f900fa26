"""Context parallelism's causal attention priced by the (query, key) pairs its mask keeps
(partita/ops/nn.py ``masked_attention_pairs``): cp marks the attention on the gathered keys
with ``causal_cp``, and a rank is priced as a flash kernel run on each of its two query chunks
against the keys up to it, so the cp ranks together score what one device's causal attention
scores (exactly where a chunk is a whole number of 128-row tiles), not cp times half of it."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.cluster.cost import CostModel
from partita.ir.builder import Builder
from partita.ir.diagnostics import TypeRuleError
from partita.ir.dtypes import bf16, f32
from partita.ir.graph import Graph
from partita.ir.types import TensorType
from partita.ops import nn
from partita.ops.nn import (FLASH_TILE, attention_pairs, balanced_causal_pairs, chunk_causal_pairs,
                            masked_attention_pairs)
from partita.ops.registry import OPS
from partita.parallel.strategies.cp import balanced_positions
from partita.parallel.strategy import parallelize


@pytest.mark.parametrize("s", [5, 128, 129, 300, 2048])
def test_one_chunk_from_position_zero_is_one_devices_causal_attention(s):
    q = TensorType((1, s, 8), bf16)
    assert chunk_causal_pairs(0, s, s) == attention_pairs(q, q, True)


@pytest.mark.parametrize("seq,cp", [(131072, 16), (16384, 8), (4096, 4), (1024, 2)])
def test_cp_ranks_together_score_one_devices_causal_tiles(seq, cp):
    """Chunks of whole tiles: every rank scores the same, and cp ranks one device's tiles."""
    assert (seq // (2 * cp)) % FLASH_TILE == 0
    per = [balanced_causal_pairs(seq // cp, seq, cp, r) for r in range(cp)]
    one = attention_pairs(TensorType((1, seq, 8), bf16), TensorType((1, seq, 8), bf16), True)
    assert len(set(per)) == 1 and sum(per) == one
    assert per[0] == (seq * seq + seq * FLASH_TILE) // (2 * cp)   # half, and half the diagonal's tiles


@pytest.mark.parametrize("seq,cp", [(1000, 5), (96, 3), (640, 4)])
def test_cp_ranks_score_one_devices_tiles_within_the_block_rounding(seq, cp):
    """Chunks that end inside a tile: each chunk's partial last tile is rounded up once more."""
    per = [balanced_causal_pairs(seq // cp, seq, cp, r) for r in range(cp)]
    one = attention_pairs(TensorType((1, seq, 8), bf16), TensorType((1, seq, 8), bf16), True)
    assert one <= sum(per) <= one + 2 * cp * FLASH_TILE * FLASH_TILE


@pytest.mark.parametrize("seq,cp", [(16, 2), (48, 3), (1000, 5)])
def test_pair_by_pair_the_count_is_the_masks_kept_pairs(seq, cp, monkeypatch):
    """With one-pair tiles the count is exactly the pairs of the mask cp builds (key position
    <= query position over the balanced positions), the same on every rank."""
    monkeypatch.setattr(nn, "FLASH_TILE", 1)
    nn.chunk_causal_pairs.cache_clear()
    try:
        pos = balanced_positions(seq, cp)
        keys = pos.reshape(-1)
        for r in range(cp):
            kept = int((keys[None, :] <= pos[r][:, None]).sum())
            assert balanced_causal_pairs(seq // cp, seq, cp, r) == kept == seq * (seq + 1) // (2 * cp)
    finally:
        nn.chunk_causal_pairs.cache_clear()


def cp_llama_step(seq: int) -> Graph:
    """A 1-layer Llama step (bf16, 4 heads, 2 k/v heads) of sequence ``seq``."""
    fwd = partita.models.llama(1, 256, 4, seq, 128, kv_heads=2, batch=2, dtype="bf16")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True)


@pytest.mark.parametrize("cp", [2, 4])
def test_a_cp_ranks_attention_costs_one_devices_causal_attention_over_cp(cp):
    """The FLOPs of the cp program's attention and attention_grad, times cp, are one device's
    causal ones (chunks of 1024 / (2 cp) tokens: whole tiles)."""
    step = cp_llama_step(1024)
    cm = CostModel(partita.cluster.load_cluster("meta-h100-roce"))
    one = {n.op: cm.compute_time(n).flops for n in step.nodes if n.op in ("attention", "attention_grad")}
    prog = parallelize(step, f"cp={cp}", "cp")
    att = [n for n in prog.local.nodes if n.op in ("attention", "attention_grad")]
    assert {n.op for n in att} == {"attention", "attention_grad"}
    for n in att:
        assert n.attrs["causal_cp"] == cp and not n.attrs["causal"] and len(n.operands) in (4, 7)
        assert cm.compute_time(n).flops * cp == one[n.op]
        # priced at every pair of the mask it would cost about twice as much (1 + 128/1024 the diagonal)
        full = OPS[n.op].cost_of([v.type for v in n.operands], [v.type for v in n.results],
                                 dict(n.attrs, causal_cp=None))
        assert full.flops > 1.75 * cm.compute_time(n).flops


def test_the_cp_mark_does_not_change_what_attention_computes():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 8)).astype(np.float32)
    k = rng.standard_normal((2, 8, 8)).astype(np.float32)
    v = rng.standard_normal((2, 8, 8)).astype(np.float32)
    pos = balanced_positions(8, 2)[1]
    mask = np.arange(8)[None, :] <= pos[:, None]
    ref = OPS["attention"].reference
    plain = ref([q, k, v, mask], {"scale": None, "causal": False, "causal_cp": None})
    marked = ref([q, k, v, mask], {"scale": None, "causal": False, "causal_cp": 2})
    for a, b in zip(plain, marked):
        np.testing.assert_array_equal(a, b)


def test_a_cp_mark_that_does_not_fit_the_shapes_is_refused():
    g = Graph("bad")
    b = Builder(g)
    q = g.add_input("q", TensorType((1, 8, 4), f32))
    k = g.add_input("k", TensorType((1, 12, 4), f32))
    with pytest.raises(TypeRuleError, match=r"causal_cp=2 .*Tq is 8 and Tk 12.*drop the attribute"):
        b.emit("attention", q, k, k, causal_cp=2)


def test_without_the_mark_masked_attention_is_priced_at_every_pair():
    q, k = TensorType((1, 64, 8), bf16), TensorType((1, 128, 8), bf16)
    assert masked_attention_pairs(q, k, {"causal": False}) == 64 * 128
