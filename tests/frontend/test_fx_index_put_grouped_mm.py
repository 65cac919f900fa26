"""The FX importer (``torch.compile(backend="partita")``) converts what the zoo's models meet:
``aten.index_put`` in every form (assignment, accumulation, full slices before the indices,
boolean masks; ``F.fold`` is one), and the grouped matmul of transformers' MoE experts
(``transformers::grouped_mm_fallback`` and its backward), all equal to eager within 1e-5."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import partita.codegen.dynamo as pd


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b|."""
    return ((a.detach() - b.detach()).abs().max() / b.detach().abs().max().clamp_min(1e-30)).item()


def compiled(fn):
    """``fn`` compiled by partita; a graph it cannot convert is an error, not a fallback."""
    return torch.compile(fn, backend="partita", dynamic=False, options={"fallback": "error"})


def assert_same(fn, *args, tol: float = 1e-5) -> None:
    want = fn(*args)
    got = compiled(fn)(*args)
    want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert rel(g, w) <= tol, rel(g, w)
    assert pd.stats().fallbacks == 0


def _assign_leading(x, i, v):
    y = x.clone()
    y[i] = v                                   # index_put, accumulate=False, leading dim
    return y * 2


def _assign_after_slice(x, i, v):
    y = x.clone()
    y[:, i] = v[:, :1]                         # full slice before the index tensor
    return y + 1


def _accumulate_after_slice(x, i, j, v):
    return torch.ops.aten.index_put(x, [None, i, j], v, True) * 3       # x[:, i, j] += v


def _inverse_permutation(p):
    inv = torch.empty_like(p)
    inv[p] = torch.arange(p.shape[0])          # transformers' MoE restores the token order so
    return inv


def test_index_put_assignment_and_slices_convert():
    torch.manual_seed(0)
    x = torch.randn(5, 6, 4)
    i = torch.tensor([3, 0, -1])
    assert_same(_assign_leading, x, i, torch.randn(3, 6, 4))
    assert_same(_assign_after_slice, x, torch.tensor([1, 4]), torch.randn(5, 2, 4))
    j = torch.tensor([[0, 3], [3, 3]])
    assert_same(_accumulate_after_slice, x, torch.tensor([[1, 1], [5, 2]]), j, torch.randn(5, 2, 2))
    p = torch.randperm(7)
    assert_same(_inverse_permutation, p)


def _mask_fill(x, m):
    y = x.clone()
    y[m] = 0.5                                 # one value for every selected position
    return y


def _mask_rows(x, m, v):
    return torch.ops.aten.index_put(x, [None, m], v, True)   # x[:, m] += v, v shared by the rows


def test_index_put_with_a_boolean_mask_converts():
    torch.manual_seed(1)
    x = torch.randn(4, 5)
    assert_same(_mask_fill, x, x > 0)
    y = torch.randn(2, 4, 3)
    assert_same(_mask_rows, y, torch.tensor([True, False, True, True]), torch.randn(2, 1, 3))


def test_index_put_with_one_value_per_selected_position_is_refused():
    from partita.frontend.fx import UnsupportedGraph, import_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    x, m = torch.randn(4, 5), torch.tensor([True, False, True, False])
    gm = make_fx(lambda x, m, v: torch.ops.aten.index_put(x, [m], v))(x, m, torch.randn(2, 5))
    with pytest.raises(UnsupportedGraph, match="depends on the data"):
        import_fx(gm)


def _fold(x):
    cols = F.unfold(x, kernel_size=(2, 3), stride=(2, 1), dilation=(1, 2), padding=1)
    return F.fold(cols * 2.0, output_size=x.shape[2:], kernel_size=(2, 3), stride=(2, 1), dilation=(1, 2), padding=1)


def test_fold_converts():
    """F.fold (MobileViT's patches back to a feature map) is an accumulating index_put on the
    last two dims."""
    assert_same(_fold, torch.randn(2, 3, 8, 7))


# --- grouped matmul ----------------------------------------------------------------------------------

moe = pytest.importorskip("transformers.integrations.moe")
E, D, O = 4, 6, 5


def _offsets(expert: torch.Tensor) -> torch.Tensor:
    """Cumulative row counts per expert of sorted expert ids (ids >= E are past every group)."""
    counts = (expert[:, None] == torch.arange(E)[None, :]).sum(0)
    return torch.cumsum(counts, 0).to(torch.int32)


def _grouped(x, w, expert):
    return torch.ops.transformers.grouped_mm_fallback(x, w, offs=_offsets(expert))


def _expert_rows() -> torch.Tensor:
    # Group 1 is empty; the last two rows belong to no group (their output is 0).
    return torch.tensor([0, 0, 0, 2, 2, 3, 3, 3, 3, E, E])


def test_grouped_mm_fallback_converts():
    torch.manual_seed(2)
    x, w = torch.randn(11, D), torch.randn(E, D, O)
    assert_same(_grouped, x, w, _expert_rows())


def test_grouped_mm_fallback_backward_converts():
    """Training through the grouped matmul: transformers' backward op converts too."""
    torch.manual_seed(3)
    x, w = torch.randn(11, D), torch.randn(E, D, O)
    dy = torch.randn(11, O)
    grads = []
    for fn in (_grouped, compiled(_grouped)):
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        (fn(xr, wr, _expert_rows()) * dy).sum().backward()
        grads.append((xr.grad, wr.grad))
    (want_x, want_w), (got_x, got_w) = grads
    assert rel(got_x, want_x) <= 1e-5 and rel(got_w, want_w) <= 1e-5
    assert pd.stats().fallbacks == 0


def test_a_mixture_of_experts_decoder_compiles_whole():
    """A Mixtral-like causal LM (top-2 of 4 experts) runs every graph in partita."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                     num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=32)
    model = transformers.MixtralForCausalLM(cfg).eval()
    with torch.no_grad():
        for m in model.modules():
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(m, name, None)
                if isinstance(p, torch.nn.Parameter) and p.dim() == 3:
                    p.copy_(torch.randn(p.shape) * 0.05)
        ids = torch.randint(0, 64, (2, 6))
        want = model(input_ids=ids, use_cache=False).logits
        got = compiled(model)(input_ids=ids, use_cache=False).logits
    assert rel(got, want) <= 1e-5
    assert pd.stats().fallbacks == 0 and pd.stats().compiled >= 1


def test_aten_grouped_mm_converts():
    """torch's own grouped matmul (2-D input, 3-D weight, offsets) is the same product; its rows
    after the last group are undefined in torch and 0 in partita."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from partita.backend.numpy_ref import run
    from partita.frontend.fx import decomposition_table, import_fx

    torch.manual_seed(4)
    x, w = torch.randn(11, 8), torch.randn(E, 8, 4)           # strides of 16 bytes, as torch's kernel needs
    offs = torch.tensor([3, 3, 5, 9], dtype=torch.int32)
    want = torch._grouped_mm(x, w, offs=offs)
    gm = make_fx(lambda x, w, o: torch._grouped_mm(x, w, offs=o), decomposition_table=decomposition_table())(x, w, offs)
    got = torch.from_numpy(run(import_fx(gm).graph, [x.numpy(), w.numpy(), offs.numpy()])[0])
    assert rel(got[:9], want[:9]) <= 1e-5
    assert not got[9:].any()
