"""Checks written for the audit of issue 38 against its text (docs/benchmarks.md, "Issue 38
against its text"): behaviours the issue names that had no test of their own."""

from __future__ import annotations

import pytest

import partita
from partita.autodiff.recompute import analyze
from partita.cli.simulate import list_models


def _saved_per_layer(seq: int, batch: int, heads: int, hidden: int, recompute: str) -> int:
    """Bytes one more layer adds to what a bf16 GPT's forward saves for its backward (scores
    materialized, dropout 0.1, Megatron-LM's [s, b, h] layout)."""
    def saved(layers: int) -> int:
        fwd = partita.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=128, batch=batch,
                                 dtype="bf16", attention="fused_softmax", dropout=0.1, layout="sbh")
        step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", recompute=recompute)
        return analyze(step).saved_bytes
    return saved(2) - saved(1)


@pytest.mark.parametrize("seq,batch,heads,hidden", [(256, 2, 4, 64), (128, 3, 2, 64), (64, 2, 4, 128)])
def test_selective_recomputation_memory_as_korthikanti_define_it(seq, batch, heads, hidden):
    """Korthikanti et al. 2022, Sec. 4.1 and 5: a layer keeps sbh(34 + 5as/h) bytes without
    recomputation and 34sbh with selective recomputation (the attention core, QK^T, softmax,
    its dropout and attention over V, recomputed). partita's dropout regenerates its mask from a
    counter hash, so the paper's three dropout masks (2sbh + as^2b bytes) are never stored:
    none keeps 32sbh + 4as^2b; selective keeps 30sbh, the paper's 32sbh less the attention
    over V's output (2sbh), which the recomputed core makes again as well."""
    s, b, h, a = seq, batch, hidden, heads
    assert _saved_per_layer(s, b, a, h, "none") == 32 * s * b * h + 4 * a * s * s * b
    assert _saved_per_layer(s, b, a, h, "selective") == 30 * s * b * h


def test_list_models_names_the_models_the_issue_asks_for():
    """``partita simulate --list-models``: gpt3-175b, the Llama 3 sizes and Megatron-LM's
    Table 1 GPTs (1.7B to 1T)."""
    text = list_models()
    for name in ("gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "megatron-1.7b", "megatron-3.6b",
                 "megatron-7.5b", "megatron-18.4b", "megatron-39.1b", "megatron-76.1b", "megatron-145.6b",
                 "megatron-310.1b", "megatron-529.6b", "megatron-1008b"):
        assert f"\n{name} " in text
