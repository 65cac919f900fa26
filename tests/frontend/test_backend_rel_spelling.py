"""The torch.compile backend's program reaches the rewrites the import path reaches on DeBERTa-v2
(``rel_scores``), Funnel (the in-place mask read back without scatters) and BLOOM (ALiBi as one
attention node per layer): small models of each family against eager; and the respelling of
folded index constants (partita/codegen/fx_spelling.py) against the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita.codegen.dynamo as pd
from partita.codegen.fx_spelling import iota_plus, respell_folded_indices, shared_rows
from partita.ir import Builder, TensorType, verify
from partita.ir.attrs import DenseAttr
from partita.ir.dtypes import DTYPES

from strategies import random_inputs, run_reference

transformers = pytest.importorskip("transformers")

F32, I64 = DTYPES["f32"], DTYPES["i64"]


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    pd.reset_stats()
    yield
    torch._dynamo.reset()


def _backend_ops(model: torch.nn.Module, **inputs: torch.Tensor) -> list[str]:
    """The ops of the backend's program for ``model`` (one graph, frozen, run by partita),
    after checking its result against eager."""
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
        got = torch.compile(model, backend="partita", options={"choose": "partita"})(**inputs).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    recs = [r for r in pd.stats().graphs if r.program is not None]
    assert len(recs) == 1 and recs[0].fallback is None, pd.stats().report()
    return [n.op for n in recs[0].program.graph.nodes]


def _text(batch: int = 2, seq: int = 7, vocab: int = 50) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, -2:] = 0
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g), "attention_mask": mask}


def test_deberta_v2_backend_program_has_rel_scores() -> None:
    """Both disentangled terms of each layer are ``rel_scores`` (no gather left), as on the
    import path; the folded [N, T, C] position index is read as one [T, C] table."""
    torch.manual_seed(0)
    cfg = transformers.DebertaV2Config(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                       position_buckets=8, max_relative_positions=16, type_vocab_size=0)
    ops = _backend_ops(transformers.DebertaV2Model(cfg).eval(), **_text())
    assert ops.count("rel_scores") == 4 and "gather" not in ops, sorted(set(ops))


def test_funnel_backend_program_reads_the_mask_write_back_without_scatters() -> None:
    """``positional_attn *= cls_mask`` on a view is read back as the values written: no
    ``scatter_elements`` in the program, one attention node per attention layer."""
    torch.manual_seed(0)
    cfg = transformers.FunnelConfig(vocab_size=50, d_model=32, n_head=2, d_head=16, d_inner=64, block_sizes=[1, 1],
                                    num_decoder_layers=1)
    ops = _backend_ops(transformers.FunnelModel(cfg).eval(), **_text(seq=8))
    assert "scatter_elements" not in ops and ops.count("attention") == 3, sorted(set(ops))


def test_bloom_backend_program_has_one_attention_per_layer() -> None:
    """ALiBi's biased scores stay one attention node a layer."""
    torch.manual_seed(0)
    cfg = transformers.BloomConfig(vocab_size=50, hidden_size=32, n_layer=2, n_head=2)
    ops = _backend_ops(transformers.BloomModel(cfg).eval(), **_text())
    assert ops.count("attention") == 2, sorted(set(ops))


# --- the respelling itself -------------------------------------------------------------------

def _gather_graph(index: np.ndarray):
    b = Builder()
    x = b.input("x", TensorType(index.shape[:-1] + (9,), F32))
    idx = b.emit("constant", value=DenseAttr(index))
    return verify(b.ret(b.gather(x, idx, axis=2)))


def _scatter_graph(index: np.ndarray, axis: int):
    b = Builder()
    shape = tuple(index.shape)
    big = tuple(s + 3 if d == axis else s for d, s in enumerate(shape))
    x = b.input("x", TensorType(big, F32))
    u = b.input("u", TensorType(shape, F32))
    idx = b.emit("constant", value=DenseAttr(index))
    return verify(b.ret(b.scatter_elements(x, idx, u, axis=axis)))


def _same_meaning(g, rewrites: int) -> list[str]:
    inputs = random_inputs(g, 3)
    before = run_reference(g, inputs)
    assert respell_folded_indices(g) == rewrites
    verify(g)
    for got, want in zip(run_reference(g, inputs), before):
        np.testing.assert_array_equal(got, want)
    return [n.op for n in g.nodes]


@pytest.mark.parametrize("n,t,c", [(4, 5, 3), (2, 1, 6), (3, 7, 7)])
def test_equal_row_slices_become_a_broadcast(n: int, t: int, c: int) -> None:
    rng = np.random.default_rng(n + t + c)
    one = rng.integers(0, 9, (1, t, c)).astype(np.int64)
    ops = _same_meaning(_gather_graph(np.repeat(one, n, axis=0)), 1)
    assert "broadcast_to" in ops


def test_unequal_row_slices_stay_a_constant() -> None:
    index = np.random.default_rng(0).integers(0, 9, (3, 4, 5)).astype(np.int64)
    index[1, 0, 0] = (index[0, 0, 0] + 1) % 9
    assert not shared_rows(index)
    assert "broadcast_to" not in _same_meaning(_gather_graph(index), 0)


@pytest.mark.parametrize("shape,axis,k", [((2, 3, 4, 5), 2, 1), ((2, 3, 4, 5), 3, 0), ((3, 6), 0, 2), ((4,), 0, 3)])
def test_iota_constants_become_an_iota(shape: tuple, axis: int, k: int) -> None:
    ramp = np.arange(shape[axis], dtype=np.int64).reshape([s if d == axis else 1 for d, s in enumerate(shape)])
    index = np.broadcast_to(ramp + k, shape).copy()
    assert iota_plus(index, axis) == k
    ops = _same_meaning(_scatter_graph(index, axis), 1)
    assert "iota" in ops and "constant" not in ops and (("add" in ops) == bool(k))


def test_other_scatter_indices_stay() -> None:
    index = np.broadcast_to(np.arange(4, dtype=np.int64)[::-1].reshape(1, 4), (3, 4)).copy()
    assert iota_plus(index, 1) is None
    assert "iota" not in _same_meaning(_scatter_graph(index, 1), 0)
