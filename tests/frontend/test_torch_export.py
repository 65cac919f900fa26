"""The torch.export importer: real models match eager PyTorch on both executors, weights and
roles come across, nodes keep the model's source lines, and unsupported ops are all reported
at once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.frontend import FrontendError
from partita.frontend import torch_export
from partita.ir.dtypes import bf16, f32, i64

RTOL = 1e-4


def _line_of(marker: str) -> int:
    """The 1-based line of this file that carries ``marker`` in a comment."""
    with open(__file__) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# @{marker}")]
    assert len(hits) == 1, marker
    return hits[0]


def _check_matches_eager(graph, module, args) -> None:
    """Both executors reproduce eager PyTorch to RTOL (relative to the output's scale)."""
    with torch.no_grad():
        ref = module(*args)
    refs = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
    numpy_outs = partita.run(graph, [a.numpy() for a in args], backend="numpy")
    torch_outs = partita.run(graph, list(args), backend="torch")
    assert len(numpy_outs) == len(torch_outs) == len(refs)
    for n_out, t_out, r in zip(numpy_outs, torch_outs, refs):
        scale = max(float(np.abs(r).max()), 1.0)
        assert np.asarray(n_out).shape == r.shape
        np.testing.assert_allclose(np.asarray(n_out), r, rtol=RTOL, atol=RTOL * scale)
        np.testing.assert_allclose(t_out.numpy(), r, rtol=RTOL, atol=RTOL * scale)


# --- an MLP --------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 16)
        self.head = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))  # @mlp-fc1
        h = torch.tanh(self.fc2(h)) * 0.5 + torch.sigmoid(h[:, :16])  # @mlp-fc2
        return torch.log_softmax(self.head(h), dim=-1)  # @mlp-head


def test_mlp_matches_eager_with_weights_roles_and_locations() -> None:
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(4, 12)
    g = partita.import_torch(model, (x,))
    partita.verify(g)
    _check_matches_eager(g, model, (x,))

    roles = {v.name: v.role for v in g.inputs}
    assert roles == {"fc1.weight": "param", "fc1.bias": "param", "fc2.weight": "param", "fc2.bias": "param",
                     "head.weight": "param", "head.bias": "param", "x": "input"}
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(g.weights[name], p.detach().numpy())
    assert set(g.weights) == {n for n, r in roles.items() if r == "param"}

    # Every node comes from this file, at the line of the model code that produced it.
    locs = {(n.op, n.loc.line) for n in g.nodes if n.loc is not None}
    assert all(n.loc is not None and n.loc.file == __file__ for n in g.nodes)
    assert ("gelu", _line_of("mlp-fc1")) in locs
    assert ("matmul", _line_of("mlp-fc1")) in locs
    assert ("tanh", _line_of("mlp-fc2")) in locs
    assert ("slice", _line_of("mlp-fc2")) in locs
    assert ("log_softmax", _line_of("mlp-head")) in locs
    # The location survives the text form.
    text = partita.print_graph(g)
    assert f'loc("{__file__}":{_line_of("mlp-head")})' in text
    parsed = partita.parse(text)
    assert [n.loc for n in parsed.nodes] == [n.loc for n in g.nodes]


# --- a ResNet-18-style CNN ---------------------------------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))  # @block-conv1
        out = self.bn2(self.conv2(out))
        skip = x if self.down is None else self.down(x)
        return F.relu(out + skip)  # @block-add


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 8, 1))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2), BasicBlock(16, 16, 1))
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.bn(self.stem(x))))  # @resnet-stem
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avg(x), 1))  # @resnet-head


def _randomize_bn_stats(model: nn.Module) -> None:
    """Non-trivial running statistics and affine parameters, so eval batch norm is tested."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)


def test_resnet_style_cnn_matches_eager() -> None:
    torch.manual_seed(0)
    model = SmallResNet().eval()
    _randomize_bn_stats(model)
    x = torch.randn(2, 3, 32, 32)
    g = partita.import_torch(model, (x,))
    partita.verify(g)
    _check_matches_eager(g, model, (x,))

    ops = {n.op for n in g.nodes}
    assert {"conv2d", "batch_norm", "max_pool2d", "mean", "matmul", "relu", "add"} <= ops
    roles = {v.name: v.role for v in g.inputs}
    assert roles["layer2.0.down.0.weight"] == "param"
    assert roles["layer1.1.bn2.running_var"] == "state"
    assert roles["layer1.1.bn2.num_batches_tracked"] == "state"
    np.testing.assert_array_equal(g.weights["layer1.0.bn1.running_mean"], model.layer1[0].bn1.running_mean.numpy())
    assert g.weights["bn.num_batches_tracked"].dtype == np.int64

    lines = {n.loc.line for n in g.nodes if n.op == "conv2d"}
    assert _line_of("resnet-stem") in lines and _line_of("block-conv1") in lines
    assert {n.loc.line for n in g.nodes if n.op == "max_pool2d"} == {_line_of("resnet-stem")}


# --- scalars, kwargs, indexing and attention -----------------------------------------------------

class ScalarPromotion(nn.Module):
    def forward(self, i: torch.Tensor, b: torch.Tensor, h: torch.Tensor):
        return i * 3, i * 0.5, b + 1, h * 2.5, (i > 2) & b, h - 1


def test_python_scalars_follow_torch_promotion() -> None:
    i = torch.arange(6).reshape(2, 3)
    b = torch.tensor([[True, False, True], [False, True, True]])
    h = torch.randn(2, 3).to(torch.bfloat16)
    g = partita.import_torch(ScalarPromotion(), (i, b, h))
    partita.verify(g)
    assert [v.type.dtype for v in g.outputs] == [i64, f32, i64, bf16, partita.dtypes.bool_, bf16]
    # Each scalar constant has the dtype PyTorch gives it against its tensor.
    consts = [n.attrs["dtype"] for n in g.nodes if n.op == "full"]
    assert consts == [i64, f32, i64, bf16, i64, bf16]
    ref = ScalarPromotion()(i, b, h)
    outs = partita.run(g, [i, b, h], backend="torch")
    for o, r in zip(outs, ref):
        assert o.dtype == r.dtype
        torch.testing.assert_close(o, r)


class Gatherer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(5, 4, 3))

    def forward(self, rows: torch.Tensor, cols: torch.Tensor, *, scale: torch.Tensor):
        return self.table[rows, cols] * scale


def test_advanced_indexing_and_keyword_inputs() -> None:
    torch.manual_seed(0)
    rows = torch.tensor([[0, 4], [-1, 2]])
    cols = torch.tensor([[1], [3]])
    scale = torch.tensor(2.0)
    model = Gatherer()
    g = partita.import_torch(model, (rows, cols), {"scale": scale})
    partita.verify(g)
    assert [v.name for v in g.inputs if v.role == "input"] == ["rows", "cols", "scale"]
    out = partita.run(g, [rows.numpy(), cols.numpy(), scale.numpy()])[0]
    np.testing.assert_allclose(out, model(rows, cols, scale=scale).detach().numpy(), rtol=1e-6)


class Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        masked = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                                attn_mask=mask, scale=0.3)
        return causal, masked


def test_scaled_dot_product_attention_with_causal_mask_and_gqa() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    mask = torch.rand(6, 6) > 0.3
    mask[:, 0] = True  # no fully masked row (PyTorch gives NaN there)
    g = partita.import_torch(Attention(), (q, k, v, mask))
    partita.verify(g)
    assert any(n.op == "attention" for n in g.nodes)
    _check_matches_eager(g, Attention(), (q, k, v, mask))


class MaskedAttention(nn.Module):
    """Masks computed inside the model: causal and keep-all ones from index arithmetic (which
    fold to attention flags), and one that depends on an input (which stays an operand)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor):
        i = torch.arange(q.shape[-2])
        causal = (i[:, None] >= i[None, :])[None, None].expand(q.shape[0], 1, -1, -1)
        additive = torch.where(causal[0, 0], 0.0, float("-inf"))
        keep_all = i[None, :] < q.shape[-2] + 1
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        b = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
        c = F.scaled_dot_product_attention(q, k, v, attn_mask=keep_all)
        d = F.scaled_dot_product_attention(q, k, v, attn_mask=causal & (pad[:, None, None, :] > 0))
        return a, b, c, d


def test_constant_masks_fold_to_attention_flags() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)
    pad = torch.ones(2, 5)
    g = partita.import_torch(MaskedAttention(), (q, k, v, pad))
    partita.verify(g)
    att = [n for n in g.nodes if n.op == "attention"]
    assert [(len(n.operands), n.attrs["causal"]) for n in att] == [(3, True), (3, True), (3, False), (4, False)]
    _check_matches_eager(g, MaskedAttention(), (q, k, v, pad))


# --- errors -----------------------------------------------------------------------------------------

class Unsupported(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.special.bessel_j1(x)  # @unsupported-j1
        y = y.relu() + 1
        top = torch.special.bessel_j0(x[:, :2])  # @unsupported-bessel
        return torch.cat([y, top, torch.special.bessel_j1(top)], dim=1)  # @unsupported-j1-again


def test_every_unsupported_op_is_listed_with_its_line() -> None:
    with pytest.raises(FrontendError) as info:
        partita.import_torch(Unsupported(), (torch.randn(3, 4),))
    msg = str(info.value)
    assert "3 unsupported op use(s) of 2 op(s) (aten.special_bessel_j0.default, aten.special_bessel_j1.default)" in msg
    for marker, op in (("unsupported-j1", "aten.special_bessel_j1.default"),
                       ("unsupported-bessel", "aten.special_bessel_j0.default"),
                       ("unsupported-j1-again", "aten.special_bessel_j1.default")):
        assert f"{__file__}:{_line_of(marker)}: {op}" in msg
    # Ops downstream of an unsupported one are skipped, not reported.
    assert "relu" not in msg and "cat" not in msg
    assert isinstance(info.value, partita.PartitaError)


class UsesPoolIndices(nn.Module):
    def forward(self, x: torch.Tensor):
        values, indices = F.max_pool2d(x, 2, return_indices=True)  # @pool-indices
        return values, indices


def test_max_pool_indices_in_use_are_imported() -> None:
    x = torch.randn(1, 2, 4, 4)
    g = partita.import_torch(UsesPoolIndices(), (x,))
    pools = [n for n in g.nodes if n.op == "max_pool2d_with_indices"]
    assert len(pools) == 1 and pools[0].loc.line == _line_of("pool-indices")
    _check_matches_eager(g, UsesPoolIndices(), (x,))


def test_a_converter_that_disagrees_with_torch_is_caught(monkeypatch) -> None:
    def wrong_relu(cx, x):
        return cx.emit("cast", cx.emit("relu", x), dtype=i64)

    monkeypatch.setitem(torch_export.ATEN_TO_PARTITA, torch.ops.aten.relu.default, wrong_relu)
    with pytest.raises(FrontendError, match=r"aten\.relu\.default .*partita inferred i64\[2,3\] but torch.export "
                                            r"recorded f32\[2,3\]"):
        partita.import_torch(nn.ReLU(), (torch.randn(2, 3),))


# --- GPT-2 from transformers -----------------------------------------------------------------------

class _Logits(nn.Module):
    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits


def test_gpt2_matches_eager() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32, use_cache=False,
                     bos_token_id=0, eos_token_id=0)
    model = _Logits(GPT2LMHeadModel(cfg)).eval()
    ids = torch.randint(0, 128, (2, 16))
    g = partita.import_torch(model, (ids,))
    partita.verify(g)
    _check_matches_eager(g, model, (ids,))
    assert g.input("lm.transformer.wte.weight").role == "param"
    assert "lm.transformer.h.1.attn.c_attn.weight" in g.weights
    # Locations point into the model's own code, not into torch.
    files = {n.loc.file for n in g.nodes if n.loc is not None}
    assert any(f.endswith("modeling_gpt2.py") for f in files)
    assert not any("/torch/" in f for f in files)


def test_gpt2_passed_as_is_with_its_kv_cache_on() -> None:
    # The default config has use_cache=True: the model returns a cache object torch.export
    # cannot flatten. The importer exports without the cache and restores the config.
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    assert model.config.use_cache
    ids = torch.randint(0, 64, (1, 8))
    g = partita.import_torch(model, (ids,))
    assert model.config.use_cache, "the user's config must be left as it was"
    _check_matches_eager(g, lambda t: model(t).logits, (ids,))


def test_llama_with_grouped_query_attention_matches_eager() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=32, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0)
    model = _Logits(LlamaForCausalLM(cfg)).eval()
    ids = torch.randint(0, 128, (2, 16))
    g = partita.import_torch(model, (ids,))
    partita.verify(g)
    _check_matches_eager(g, model, (ids,))
    # Two key/value heads serve four query heads.
    assert g.input("lm.model.layers.0.self_attn.k_proj.weight").type.shape == (32, 64)


class _BertHidden(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state


def test_bert_with_padding_mask_matches_eager() -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     vocab_size=128, max_position_embeddings=32, pad_token_id=0)
    model = _BertHidden(BertModel(cfg, add_pooling_layer=False)).eval()
    ids = torch.randint(0, 128, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 10:] = 0
    g = partita.import_torch(model, (ids, mask))
    partita.verify(g)
    _check_matches_eager(g, model, (ids, mask))
    assert g.input("bert.embeddings.position_ids").role == "state"


# --- a zoo of smaller converters, each checked against eager -------------------------------------

class Zoo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.ln = nn.LayerNorm(4, elementwise_affine=False)
        self.bn = nn.BatchNorm2d(3, affine=False)

    def forward(self, x: torch.Tensor, img: torch.Tensor, ids: torch.Tensor):
        a, b = torch.split(x, [2, 4], dim=1)
        first = x[:, 1]
        sq = x.unsqueeze(0).squeeze(0).expand(2, 3, 6)
        cs = torch.cumsum(x > 0, dim=1)
        padded = F.pad(x, (1, 2), value=0.5)
        pooled = F.avg_pool2d(self.bn(img), 2)
        adaptive = F.adaptive_avg_pool2d(img, (2, 2))
        idx = torch.argmax(x, dim=1)
        top = torch.amax(x, dim=0, keepdim=True)
        steps = torch.arange(1, 7, 2) * 1.5 + torch.full((3,), 2.0)
        chosen = torch.where(x > 0, x, 0.0) ** 2
        normed = self.ln(self.emb(ids + 3))
        summed = x.sum() + x.mean(dim=-1).sum()
        picked = img[:, ids] + img[ids, 1:]
        return picked, a * 2 - b.sum(1, keepdim=True), first, sq, cs, padded, pooled, adaptive, idx, top, steps, \
            chosen, normed, summed, torch.transpose(img, 1, 3).reshape(2, -1).softmax(dim=0)


def test_converter_zoo_matches_eager() -> None:
    torch.manual_seed(0)
    model = Zoo().eval()
    _randomize_bn_stats(model)
    args = (torch.randn(3, 6), torch.randn(2, 3, 4, 4), torch.tensor([[1, -1], [0, 1]]))
    g = partita.import_torch(model, args)
    partita.verify(g)
    _check_matches_eager(g, model, args)


def test_a_module_in_training_mode_is_refused_with_the_fix() -> None:
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))  # training mode: updates running stats
    with pytest.raises(FrontendError, match=r"Sequential mutates 1\.running_mean, 1\.running_var.*module\.eval\(\)"):
        partita.import_torch(model, (torch.randn(2, 1, 5, 5),))


def test_a_converter_that_cannot_take_the_arguments_is_reported_not_crashed(monkeypatch) -> None:
    monkeypatch.setitem(torch_export.ATEN_TO_PARTITA, torch.ops.aten.relu.default, lambda cx: None)
    with pytest.raises(FrontendError, match=r"aten\.relu\.default: arguments the converter does not handle"):
        partita.import_torch(nn.ReLU(), (torch.randn(2, 3),))


def test_every_converter_runs_on_an_op_the_decompositions_leave_whole() -> None:
    # torch.export decomposes every op in the table before any converter runs: a converter
    # keyed by such an op would never fire (as aten.silu's did, F.silu arriving as sigmoid *
    # x). Each converter's op must be one the table leaves whole, or be kept whole on purpose.
    table = torch_export.decomposition_table()
    dead = sorted(str(op) for op in torch_export.ATEN_TO_PARTITA if op in table)
    assert not dead, (f"converters that never run, their ops being decomposed first: {dead}; add each op to "
                      "_KEEP_WHOLE in partita/frontend/torch_export.py, or remove the converter")
    core = torch.export.default_decompositions()
    for op in torch_export._KEEP_WHOLE:
        assert op in torch_export.ATEN_TO_PARTITA, f"{op} is kept whole but has no converter"
        assert op in core, f"{op} is kept whole, but the core table does not decompose it anyway"


class SiLU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x) + nn.SiLU()(x * 2)


def test_silu_imports_as_the_silu_op_and_matches_eager() -> None:
    args = (torch.randn(4, 7) * 3,)
    g = partita.import_torch(SiLU(), args)
    partita.verify(g)
    ops = [n.op for n in g.nodes]
    assert ops.count("silu") == 2 and "sigmoid" not in ops
    _check_matches_eager(g, SiLU(), args)


def test_the_unsupported_op_error_says_how_to_add_a_converter() -> None:
    with pytest.raises(FrontendError) as info:
        partita.import_torch(Unsupported(), (torch.randn(3, 4),))
    msg = str(info.value)
    assert "add a converter to ATEN_TO_PARTITA in partita/frontend/torch_export.py" in msg
    assert "a converter runs only for an op the decomposition table leaves whole" in msg
    assert "also add it to _KEEP_WHOLE" in msg and "docs/adding-an-op.md" in msg


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum() > 0 else x


def test_an_export_failure_is_a_frontend_error() -> None:
    with pytest.raises(FrontendError, match=r"torch\.export failed on DataDependent"):
        partita.import_torch(DataDependent(), (torch.randn(2, 3),))


class Activations(nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor):
        return (F.relu6(x * 4), x.clamp(-0.5, 0.5), F.leaky_relu(x, 0.1), F.hardswish(x), F.elu(x, 0.7),
                x.var(1), x.var(0, correction=0, keepdim=True), torch.var(x), i.clamp(min=1, max=3),
                i.clamp(max=x))


def test_clamps_activations_and_variance_match_eager() -> None:
    torch.manual_seed(0)
    args = (torch.randn(3, 5), torch.arange(15).reshape(3, 5) - 4)
    g = partita.import_torch(Activations(), args)
    partita.verify(g)
    _check_matches_eager(g, Activations(), args)


class _Nonzero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x) + 1  # @nonzero


def test_data_dependent_shape_is_one_clear_error_with_the_source_line() -> None:
    with pytest.raises(FrontendError) as info:
        partita.import_torch(_Nonzero().eval(), (torch.randn(4, 5),))
    msg = str(info.value)
    assert f"{__file__}:{_line_of('nonzero')}" in msg
    assert "aten.nonzero" in msg and "depends on the input data" in msg and "static shapes" in msg


# --- transposed and 3-d convolution, 3-d pooling ---------------------------------------------------

class VolumeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1, groups=1)
        self.up1d = nn.ConvTranspose1d(4, 2, 3, stride=2, groups=2)
        self.conv3 = nn.Conv3d(4, 6, (2, 3, 3), stride=(1, 2, 1), padding=(1, 1, 0), dilation=(1, 1, 2), groups=2)
        self.max3 = nn.MaxPool3d(2, stride=(1, 2, 2), padding=1, ceil_mode=True)
        self.avg3 = nn.AvgPool3d((2, 3, 2), stride=2, padding=(1, 1, 0), count_include_pad=False)

    def forward(self, x: torch.Tensor):
        u = torch.relu(self.up(x))                          # [2, 4, 10, 10]
        v = self.conv3(u.unsqueeze(2).expand(-1, -1, 3, -1, -1))
        values, indices = F.max_pool3d(v, 2, return_indices=True)
        return self.up1d(u[:, :, 0]), self.max3(v), self.avg3(v), values, indices


def test_transposed_and_3d_convolution_and_pooling_match_eager() -> None:
    torch.manual_seed(0)
    model = VolumeNet().eval()
    x = torch.randn(2, 3, 5, 5)
    g = partita.import_torch(model, (x,))
    partita.verify(g)
    _check_matches_eager(g, model, (x,))
    ops = {n.op for n in g.nodes}
    assert {"conv_transpose2d", "conv3d", "max_pool3d", "max_pool3d_with_indices", "avg_pool3d"} <= ops
