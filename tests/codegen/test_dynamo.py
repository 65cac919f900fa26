"""``torch.compile(model, backend="partita")``: outputs and gradients equal eager PyTorch's, the
graphs really run partita's fused kernels, and a graph partita cannot convert falls back to ATen
with one warning (docs/codegen.md, "torch.compile backend")."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita.codegen.dynamo as pd

transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| relative to max |b|."""
    return ((a.detach() - b.detach()).abs().max() / b.detach().abs().max().clamp_min(1e-30)).item()


def assert_grads_equal(compiled: nn.Module, eager: nn.Module, tol: float = 1e-5) -> None:
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            assert rel(p.grad, q.grad) <= tol, f"{name}: relative difference {rel(p.grad, q.grad):.3g}"


LIBRARY_OPS = {"conv2d_pointwise", "linear_pointwise"}     # oneDNN with fused epilogues (library.py)


def assert_all_compiled(min_graphs: int) -> pd.Stats:
    """Every graph was compiled by partita (none fell back) and runs its fused kernels or its
    library kernels with fused epilogues (an inference graph's frozen weights fold into those)."""
    s = pd.stats()
    assert s.fallbacks == 0, s.report()
    assert s.compiled >= min_graphs, s.report()
    fused_or_library = 0
    for g in s.graphs:
        assert g.program is not None
        ops = [n.op for n in g.program.graph.nodes]
        assert ("fused" in ops) == (g.kernels > 0)
        fused_or_library += g.kernels + sum(op in LIBRARY_OPS for op in ops)
    assert fused_or_library > 0, s.report()
    return s


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(24, 48)
        self.fc2 = nn.Linear(48, 48)
        self.out = nn.Linear(48, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        h = F.gelu(self.fc2(h)) + h
        return self.out(h)


def test_mlp_gelu_outputs_and_gradients_equal_eager():
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    x = torch.randn(16, 24)
    compiled = torch.compile(model, backend="partita")

    with torch.no_grad():
        assert rel(compiled(x), eager(x)) <= 1e-5
    assert [g.kind for g in pd.stats().graphs] == ["inference"]

    y = compiled(x)
    loss = (y * y).mean()
    loss.backward()
    ref = eager(x)
    (ref * ref).mean().backward()
    assert rel(y, ref) <= 1e-5
    assert_grads_equal(model, eager)
    s = assert_all_compiled(3)
    assert [g.kind for g in s.graphs] == ["inference", "forward", "backward"]
    # The gelu chains of forward and backward are generated kernels; in the inference graph the
    # frozen weights put them into the linear layers' epilogues.
    assert all(g.kernels > 0 for g in s.graphs[1:]), s.report()
    assert [n.attrs["unary"] for n in s.graphs[0].program.graph.nodes if n.op == "linear_pointwise"] == \
        ["gelu", "gelu", "none"], s.report()

    # A second step reuses the compiled graphs.
    model.zero_grad()
    compiled(x).sum().backward()
    assert len(pd.stats().graphs) == 3


class Block(nn.Module):
    """conv-bn-relu twice with a residual add, global average pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(h + self.bn2(self.conv2(h)))
        return self.fc(h.mean((2, 3)))


def test_cnn_conv_bn_relu_residual_eval_equals_eager():
    torch.manual_seed(0)
    model = Block()
    for bn in (model.bn1, model.bn2):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.data.uniform_(0.5, 1.5)
        bn.bias.data.uniform_(-0.5, 0.5)
    model.eval()
    x = torch.randn(2, 3, 12, 12)
    compiled = torch.compile(model, backend="partita")
    with torch.no_grad():
        assert rel(compiled(x), model(x)) <= 1e-5
    assert_all_compiled(1)


def test_cnn_training_step_equals_eager():
    """Training mode: batch statistics, the running statistics written back, and the
    convolution and pooling gradients all on partita."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 8, 3, stride=2), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8, 4))
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, backend="partita")
    compiled(x).square().mean().backward()
    eager(x).square().mean().backward()
    # The first conv's bias feeds batch norm, so its true gradient is zero: compare absolutely.
    assert (model[0].bias.grad - eager[0].bias.grad).abs().max() < 1e-6
    model[0].bias.grad = eager[0].bias.grad = None
    assert_grads_equal(model, eager)
    assert torch.allclose(model[1].running_mean, eager[1].running_mean, rtol=1e-5, atol=1e-7)
    assert torch.allclose(model[1].running_var, eager[1].running_var, rtol=1e-5, atol=1e-7)
    assert_all_compiled(2)


def small_bert():
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100)
    return transformers.BertModel(cfg).eval()


def small_gpt2(dropout: float = 0.0):
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=64,
                                  resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    return transformers.GPT2LMHeadModel(cfg)


def test_bert_with_attention_mask_equals_eager():
    torch.manual_seed(0)
    model = small_bert()
    ids = torch.randint(0, 100, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    compiled = torch.compile(model, backend="partita")
    with torch.no_grad():
        out = compiled(input_ids=ids, attention_mask=mask)
        ref = model(input_ids=ids, attention_mask=mask)
    assert rel(out.last_hidden_state, ref.last_hidden_state) <= 1e-5
    assert rel(out.pooler_output, ref.pooler_output) <= 1e-5
    assert_all_compiled(1)


def _logits(model: nn.Module) -> tuple:
    """The compiled and the eager output of ``model`` in eval mode on random ids, no grad."""
    ids = torch.randint(0, 100, (2, 16))
    compiled = torch.compile(model.eval(), backend="partita")
    with torch.no_grad():
        return compiled(input_ids=ids), model(input_ids=ids)


def _loss_backward(model: nn.Module) -> tuple:
    """The compiled model (train mode) and an eager copy each run forward with ``labels=`` and
    backward: (compiled output, eager output, the eager copy)."""
    model.train()
    eager = copy.deepcopy(model)
    ids = torch.randint(0, 100, (2, 16))
    compiled = torch.compile(model, backend="partita")
    out = compiled(input_ids=ids, labels=ids)
    out.loss.backward()
    ref = eager(input_ids=ids, labels=ids)
    ref.loss.backward()
    return out, ref, eager


def test_gpt2_logits_equal_eager():
    torch.manual_seed(0)
    out, ref = _logits(small_gpt2())
    assert rel(out.logits, ref.logits) <= 1e-5
    assert_all_compiled(1)


def test_gpt2_gradients_equal_eager():
    torch.manual_seed(0)
    model = small_gpt2()
    out, ref, eager = _loss_backward(model)
    assert rel(out.loss, ref.loss) <= 1e-5
    assert rel(out.logits, ref.logits) <= 1e-5
    assert_grads_equal(model, eager)
    s = assert_all_compiled(2)
    kinds = {g.kind for g in s.graphs}
    assert kinds == {"forward", "backward"}, s.report()
    ops = {n.op for g in s.graphs for n in g.program.graph.nodes}
    # Attention forward and backward are partita's fused ops (PyTorch's flash kernels), the
    # embedding gradients accumulate with index_add.
    assert {"attention", "attention_grad", "index_add"} <= ops


def small_qwen2():
    """A grouped-query decoder: 4 query heads over 2 key/value heads."""
    cfg = transformers.Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.Qwen2ForCausalLM(cfg)


def test_grouped_query_decoder_called_with_its_cache_equals_eager():
    # use_cache=True, the default: the key/value heads reach the flash kernel ungrouped
    torch.manual_seed(0)
    out, ref = _logits(small_qwen2())
    assert rel(out.logits, ref.logits) <= 1e-5
    assert_all_compiled(1)


def test_grouped_query_decoder_gradients_equal_eager():
    torch.manual_seed(0)
    model = small_qwen2()
    out, ref, eager = _loss_backward(model)
    assert rel(out.loss, ref.loss) <= 1e-5
    assert_grads_equal(model, eager)
    assert pd.stats().fallbacks == 0, pd.stats().report()


def test_convnext_v2_global_response_norm_compiles_and_equals_eager():
    # linalg_vector_norm (its global response norm) once left the whole graph on ATen
    torch.manual_seed(0)
    cfg = transformers.ConvNextV2Config(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=32)
    model = transformers.ConvNextV2Model(cfg)
    eager = copy.deepcopy(model)
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(model, backend="partita")
    out, ref = compiled(x), eager(x)
    assert rel(out.last_hidden_state, ref.last_hidden_state) <= 1e-5
    assert rel(out.pooler_output, ref.pooler_output) <= 1e-5
    # a loss whose gradient is not mostly cancelled (the layer norms' outputs square-sum to a constant)
    r, s = torch.randn_like(ref.last_hidden_state), torch.randn_like(ref.pooler_output)
    ((out.last_hidden_state * r).sum() + (out.pooler_output * s).sum()).backward()
    ((ref.last_hidden_state * r).sum() + (ref.pooler_output * s).sum()).backward()
    assert_grads_equal(model, eager, tol=1e-4)
    assert pd.stats().fallbacks == 0, pd.stats().report()


def test_dropout_draws_the_masks_eager_draws():
    """Dropout's mask becomes a graph input drawn with torch's generator on each call: the
    same seed gives eager's mask, and a new call a new one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.5), nn.GELU(), nn.Linear(32, 4))
    eager = copy.deepcopy(model)
    x = torch.randn(64, 32)
    compiled = torch.compile(model, backend="partita")
    torch.manual_seed(7)
    y = compiled(x)
    y.sum().backward()
    torch.manual_seed(7)
    ref = eager(x)
    ref.sum().backward()
    assert rel(y, ref) <= 1e-5
    assert_grads_equal(model, eager)
    with torch.no_grad():
        assert not torch.equal(compiled(x), compiled(x))
    assert_all_compiled(2)


def test_outputs_copy_where_eager_copies_and_view_where_eager_views():
    """partita returns an operand itself for a clone; the backend copies it, so that writing
    into the output leaves the input alone, as in eager. Views of inputs stay views."""
    x = torch.randn(3, 4)
    f = torch.compile(lambda x: (x.clone(), (x * 2).t(), x.t()), backend="partita")
    copy_, scaled, view = f(x)
    before = x.clone()
    copy_.add_(1)
    assert torch.equal(x, before)
    assert torch.equal(scaled, (x * 2).t())
    view.mul_(0)
    assert not x.any()  # eager's x.t() is a view of x


def _zoo(x, i, j, m):
    a = torch.zeros(5, 6).index_put((i, j), x[:4, :1].reshape(4) * 2, accumulate=True)
    b = torch.zeros(4, 6).scatter(1, j.reshape(4, 1).expand(4, 2), -1.0)        # repeated indices
    c = (x > 0).any(dim=1, keepdim=True) & (x > -2).all(dim=1, keepdim=True)
    d, k = x.max(dim=1)
    e = torch.bitwise_not(m) + (~(x > 0)).long().sum()
    f = torch.zeros(5, 6).index_add(0, i.abs(), x[:4], alpha=0.5)
    g = torch.zeros(4, 6).scatter_add(1, j.reshape(4, 1), x[:4, :1])
    h = torch.cat([torch.tensor([]), x], dim=0)                                 # the legacy empty operand
    return a, b, c, d, k, e, f, g, h


def test_training_graph_ops_convert_and_equal_eager():
    """The ops that AOTAutograd's training graphs add beyond torch.export's (the gradients of
    indexing, embedding and cross entropy, any/all, max with indices, ...) convert."""
    torch.manual_seed(0)
    x = torch.randn(6, 6)
    i = torch.tensor([0, 4, 4, -1])
    j = torch.tensor([1, 1, 5, 2])
    m = torch.tensor([3, -7, 0])
    out = torch.compile(_zoo, backend="partita")(x, i, j, m)
    for k, (got, want) in enumerate(zip(out, _zoo(x, i, j, m))):
        assert got.dtype == want.dtype and got.shape == want.shape, k
        assert torch.allclose(got, want, rtol=1e-6, atol=0), k
    assert_all_compiled(1)


class Cumulative(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.sigmoid(self.fc(x)) + 0.5
        h = torch.lgamma(h)  # partita has no lgamma (nor digamma, its derivative)
        return h.tanh() * 2


def test_unconvertible_op_falls_back_to_aten_with_one_warning():
    torch.manual_seed(0)
    model = Cumulative()
    eager = copy.deepcopy(model)
    x = torch.randn(4, 8)
    compiled = torch.compile(model, backend="partita")
    with pytest.warns(pd.PartitaFallbackWarning) as record:
        y = compiled(x)
    messages = [str(w.message) for w in record if issubclass(w.category, pd.PartitaFallbackWarning)]
    assert len(messages) == 1
    assert "aten.lgamma.default" in messages[0]
    assert f"{__file__}:" in messages[0]  # the model's source line
    assert rel(y, eager(x)) <= 1e-6

    # The same graph again (a recompile after reset) does not warn a second time; the
    # backward graph (lgamma's gradient, digamma) falls back with its own warning.
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        y = compiled(x)
        y.sum().backward()
    eager(x).sum().backward()
    texts = [str(w.message) for w in again if issubclass(w.category, pd.PartitaFallbackWarning)]
    assert len(texts) == 1 and "backward graph" in texts[0], texts
    assert_grads_equal(model, eager, tol=1e-6)
    s = pd.stats()
    assert s.compiled == 0 and s.fallbacks == 3
    assert all(any(op in g.unsupported for op in ("aten.lgamma.default", "aten.digamma.default")) for g in s.graphs)
    assert "on ATen" in s.report()


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Identity(), Cumulative()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[1](self.blocks[0](x))


def test_fallback_warning_names_the_module_path():
    compiled = torch.compile(Wrapped(), backend="partita")
    with pytest.warns(pd.PartitaFallbackWarning) as record:
        compiled(torch.randn(4, 8))
    (message,) = [str(w.message) for w in record if issubclass(w.category, pd.PartitaFallbackWarning)]
    assert "aten.lgamma.default in module blocks.1" in message, message
    assert "runs on ATen (its own FX code) instead" in message


def test_fallback_error_option_and_unknown_options():
    compiled = torch.compile(Cumulative(), backend="partita", options={"fallback": "error"})
    with pytest.raises(Exception, match="aten.lgamma.default"):
        compiled(torch.randn(2, 8))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="unknown option"):
        torch.compile(Cumulative(), backend="partita", options={"fusion": True})(torch.randn(2, 8))


def test_static_recompiles_per_shape_and_dynamic_shapes_fall_back():
    def f(x):
        return torch.sin(x * 2) + x.mean()

    static = torch.compile(f, backend="partita", dynamic=False)
    for n in (3, 5):
        x = torch.randn(n, 4)
        assert rel(static(x), f(x)) <= 1e-6
    assert_all_compiled(2)

    torch._dynamo.reset()
    pd.reset_stats()
    dynamic = torch.compile(f, backend="partita", dynamic=True)
    x = torch.randn(6, 4)
    with pytest.warns(pd.PartitaFallbackWarning, match="dynamic=False"):
        assert rel(dynamic(x), f(x)) <= 1e-6
    assert pd.stats().fallbacks == 1


def test_import_partita_leaves_dynamo_alone_and_the_entry_point_finds_the_backend():
    """``import partita`` does not import torch._dynamo; ``backend="partita"`` resolves through
    the package's entry point without importing partita.codegen.dynamo first."""
    script = textwrap.dedent("""
        import sys
        import partita
        assert "torch._dynamo" not in sys.modules, "import partita imported torch._dynamo"
        assert "partita.codegen.dynamo" not in sys.modules
        from importlib.metadata import entry_points
        eps = {ep.name: ep.value for ep in entry_points(group="torch_dynamo_backends")}
        assert eps.get("partita") == "partita.codegen.dynamo:partita_backend", eps
        import torch
        f = torch.compile(lambda x: torch.tanh(x * 3) + 1, backend="partita")
        torch.manual_seed(0)
        x = torch.randn(16)
        # atol: tanh's last bit at 1 (6e-8) is all of a result near 0 (x * 3 below -4)
        assert torch.allclose(f(x), torch.tanh(x * 3) + 1, atol=1e-6)
        import partita.codegen.dynamo as d
        assert d.stats().compiled == 1, d.stats().report()
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


# --- the measured choice between partita's program and ATen ----------------------------------------

def _calls_until_chosen() -> int:
    return 2 * (pd.WARMUP_CALLS + pd.MAX_TIMED_CALLS)


@pytest.mark.parametrize("slow", ["partita", "aten"])
def test_measure_keeps_the_faster_candidate_and_results_stay_eager_s(slow, monkeypatch):
    # Make one candidate slower by far: the choice must go to the other, and every call's
    # result, whichever candidate ran it, equals eager's.
    import time as _time

    if slow == "partita":
        run = pd._Runner.__call__
        monkeypatch.setattr(pd._Runner, "__call__", lambda self, args: (_time.sleep(0.02), run(self, args))[1])
    else:
        on_aten = pd._Chooser._on_aten
        monkeypatch.setattr(pd._Chooser, "_on_aten", lambda self, args: (_time.sleep(0.02), on_aten(self, args))[1])
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(16, 24)
    compiled = torch.compile(model, backend="partita")
    with torch.no_grad():
        ref = model(x)
        for _ in range(_calls_until_chosen() + 2):
            assert rel(compiled(x), ref) <= 1e-5
    (rec,) = pd.stats().graphs
    assert rec.choice.picked == ("aten" if slow == "partita" else "partita")
    # one candidate is slower by far: the first round of timed calls decides
    assert len(rec.choice.partita_ms) == len(rec.choice.aten_ms) == pd.TIMED_CALLS
    assert f"runs {rec.choice.picked}" in pd.stats().report()


def test_overlapping_timings_take_more_calls():
    # The order of two candidates is in doubt when the faster one's median call is no faster
    # than the slower one's fastest; apart, it is not.
    assert not pd.timings_overlap([1.0, 1.1, 1.0, 1.2, 1.0], [2.0, 2.1, 2.5, 2.0, 2.2])
    assert pd.timings_overlap([1.6, 5.0, 7.0, 9.0, 6.0], [2.0, 4.0, 8.0, 3.0, 9.0])
    assert pd.timings_overlap([2.0, 4.0, 8.0, 3.0, 9.0], [1.6, 5.0, 7.0, 9.0, 6.0])


def test_a_loaded_machine_does_not_decide_on_one_round():
    # Every timed call of partita's program in the first round lands in a lost time slice
    # (4 ms), ATen's calls take 6 and 2 ms in turn: the timings overlap, more rounds are timed,
    # and the program that is faster wins.
    import time as _time

    runs = {"partita": 0}

    def runner(args):
        runs["partita"] += 1
        if pd.WARMUP_CALLS < runs["partita"] <= pd.WARMUP_CALLS + pd.TIMED_CALLS:
            _time.sleep(0.004)
        return args

    def aten(args):
        _time.sleep(0.002 if len(choice.aten_ms) % 2 else 0.006)
        return args

    choice = pd.Choice("measure")
    chooser = pd._Chooser(runner, aten, choice)
    for _ in range(_calls_until_chosen()):
        chooser([1])
    assert len(choice.partita_ms) > pd.TIMED_CALLS
    assert choice.picked == "partita"


def test_choose_fixed_and_invalid():
    torch.manual_seed(0)
    model = MLP().eval()
    x = torch.randn(16, 24)
    for mode in ("partita", "aten"):
        torch._dynamo.reset()
        pd.reset_stats()
        compiled = torch.compile(model, backend="partita", options={"choose": mode})
        with torch.no_grad():
            for _ in range(3):
                assert rel(compiled(x), model(x)) <= 1e-5
        (rec,) = pd.stats().graphs
        assert rec.choice.mode == mode and rec.choice.partita_ms == [] and rec.choice.aten_ms == []
    torch._dynamo.reset()
    with pytest.raises(Exception, match="option 'choose' must be one of"):
        torch.compile(model, backend="partita", options={"choose": "fastest"})(x)


def test_a_graph_called_once_runs_partita(monkeypatch):
    # The first call of a measured graph is partita's: a model called once is checked on partita.
    ran = []
    run = pd._Runner.__call__
    monkeypatch.setattr(pd._Runner, "__call__", lambda self, args: (ran.append(1), run(self, args))[1])
    model = MLP().eval()
    compiled = torch.compile(model, backend="partita")
    with torch.no_grad():
        compiled(torch.randn(16, 24))
    (rec,) = pd.stats().graphs
    assert ran == [1]
    assert rec.choice.picked is None and rec.choice.partita_ms == []      # the warm-up call is not timed


# --- freezing: an inference graph's params as constants --------------------------------------------

def test_inference_freezes_params_so_batch_norms_fold():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, backend="partita", options={"choose": "partita"})
    with torch.no_grad():
        assert rel(compiled(x), model(x)) <= 1e-5
    (rec,) = pd.stats().graphs
    ops = [n.op for n in rec.program.graph.nodes]
    assert "batch_norm" not in ops and ops.count("conv2d_pointwise") == 2, rec.program.graph
    assert rec.choice.frozen > 0 and "params frozen" in pd.stats().report()


def test_a_param_changed_in_place_is_seen():
    # The frozen values are checked every call (memory and version): an in-place update of a
    # weight (an optimizer step, load_state_dict) runs the graph without freezing from then on.
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, backend="partita", options={"choose": "partita"})
    with torch.no_grad():
        compiled(x)
        model.conv1.weight.mul_(2.0)
        model.bn2.running_var.add_(1.0)
        assert rel(compiled(x), model(x)) <= 1e-5
        model.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()})
        assert rel(compiled(x), model(x)) <= 1e-5
    (rec,) = pd.stats().graphs
    assert "frozen params changed" in rec.choice.text()


def test_freeze_off_keeps_params_as_inputs_and_bad_value_raises():
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, backend="partita", options={"freeze": False, "choose": "partita"})
    with torch.no_grad():
        assert rel(compiled(x), model(x)) <= 1e-5
    (rec,) = pd.stats().graphs
    assert rec.choice.frozen == 0 and "batch_norm" in [n.op for n in rec.program.graph.nodes]
    torch._dynamo.reset()
    with pytest.raises(Exception, match="option 'freeze' must be True or False"):
        torch.compile(model, backend="partita", options={"freeze": "yes"})(x)


def test_frozen_weights_are_packed_under_inference_mode():
    # The frozen program's weights are made on the first call; under torch.inference_mode they
    # must still be ordinary tensors (an inference tensor has no version counter, so its packed
    # copy could never be trusted and every call would run the unpacked kernel).
    from partita.codegen.library import packed_weight_stats

    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(model, backend="partita", options={"choose": "partita"})
    before = packed_weight_stats()
    with torch.inference_mode():
        for _ in range(3):
            y = compiled(x)
        assert rel(y, model(x)) <= 1e-5
    (rec,) = pd.stats().graphs
    assert not any(t.is_inference() for t in rec.program._weights.values())
    after = packed_weight_stats()
    assert after["packed"] > before["packed"], (before, after)


def test_an_inference_tensor_buffer_stays_an_input():
    # A buffer made under torch.inference_mode has no version counter to check: it is not frozen.
    torch.manual_seed(0)
    model = MLP().eval()
    with torch.inference_mode():
        model.register_buffer("shift", torch.randn(10))

    class Shifted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(x) + self.m.shift

    wrapped = Shifted()
    compiled = torch.compile(wrapped, backend="partita", options={"choose": "partita"})
    x = torch.randn(16, 24)
    with torch.inference_mode():
        for _ in range(2):
            assert rel(compiled(x), wrapped(x)) <= 1e-5
    (rec,) = pd.stats().graphs
    assert rec.choice.frozen > 0
