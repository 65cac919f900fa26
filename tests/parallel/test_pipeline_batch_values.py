"""Pipelines on what the model zoo found (bench/bench_zoo.py), each against one device.

- Values that look as if they mixed microbatches but do not (build.py, ``microbatch_graph``):
  a loss normalised by the count of labels that are not ignored over the whole batch (Hugging
  Face's ``labels=`` loss, ``F.cross_entropy(ignore_index=...)``), and a causal mask built
  whole from shapes (Gemma2). A value that does mix microbatches (batch statistics of
  activations) is still refused.
- A trained param that no stage reads (DINOv2's mask token), and two params that share one
  gradient value (Phi's parallel attention and MLP biases)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import partita
from partita.parallel.pipeline.schedule import PipelineError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B, T, V = 8, 8, 64
LOSS_TOL = 1e-5     # the loss, relative
TOL = 1e-4          # the updated params and optimizer states, relative in the L2 norm (test_pipeline.py's):
# AdamW divides by the root of its second moment, which turns the rounding noise of a gradient
# that is nearly zero (a key projection's bias) into visible differences of its states


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6 * np.sqrt(b.size)))


def _step(module, ids, labels, optimizer="adamw"):
    from partita.autodiff.training import training_step
    from partita.backend.numpy_ref import run as run_np
    from partita.frontend.torch_export import import_torch
    from partita.passes.manager import PassManager

    fwd = import_torch(module, (ids, labels))
    fwd = PassManager.parse("split-projections").run(fwd)
    step = training_step(fwd, optimizer=optimizer, lr=1e-3)
    names = [v.name for v in fwd.inputs if v.role == "input"]
    inputs = dict(zip(names, [ids.numpy(), labels.numpy()]))
    want = run_np(step, {**{k: np.asarray(a) for k, a in step.weights.items()}, **inputs})
    return SimpleNamespace(step=step, inputs=inputs, want=want)


class _HFLoss(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, labels):
        return self.lm(input_ids=ids, labels=labels, use_cache=False).loss


def _labels(ids):
    labels = ids.clone()
    labels[1, :3] = -100           # ignored tokens: the count differs between microbatches
    labels[5, 2:] = -100
    return labels


@pytest.fixture(scope="module")
def qwen2():
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    ids = torch.randint(0, V, (B, T))
    return _step(_HFLoss(transformers.Qwen2ForCausalLM(cfg)).train(), ids, _labels(ids))


@pytest.fixture(scope="module")
def gemma2():
    torch.manual_seed(0)
    cfg = transformers.Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                    max_position_embeddings=32, sliding_window=4)
    ids = torch.randint(0, V, (B, T))
    return _step(_HFLoss(transformers.Gemma2ForCausalLM(cfg)).train(), ids, _labels(ids))


def _check(model, mesh, strategy, **kw):
    prog = partita.parallelize(model.step, mesh=mesh, strategy=strategy, **kw)
    got = prog.simulate(model.inputs)
    assert _rel(got[0], model.want[0]) <= LOSS_TOL, (float(got[0]), float(model.want[0]))
    bad = [f"%{v.name}: {_rel(o, w):.2e}" for o, w, v in zip(got, model.want, model.step.outputs)
           if not _rel(o, w) <= TOL]
    assert not bad, f"{strategy} on {mesh} {kw}: {', '.join(bad[:6])}"
    return prog


CASES = [("pp=2", "pp", dict(microbatches=4, schedule="1f1b")),
         ("pp=2,dp=2", "pp+dp", dict(microbatches=4, schedule="1f1b")),
         ("pp=2", "pp", dict(microbatches=4, schedule="interleaved", virtual_stages=2)),
         ("pp=2", "pp", dict(microbatches=2, schedule="zero-bubble")),
         ("pp=2,dp=2", "pp+zero3", dict(microbatches=2, schedule="gpipe"))]


@pytest.mark.parametrize("mesh,strategy,kw", CASES)
def test_hugging_face_loss_over_the_whole_batch_count_matches_one_device(qwen2, mesh, strategy, kw):
    prog = _check(qwen2, mesh, strategy, **kw)
    # each microbatch reads the whole batch's labels for the count, not a sum across microbatches
    assert any(str(v.name).endswith(".whole") for st in prog.stages for v in st.graph.inputs)


@pytest.mark.parametrize("mesh,strategy,kw", CASES[:2] + CASES[4:])
def test_causal_mask_built_from_shapes_is_sliced_per_microbatch(gemma2, mesh, strategy, kw):
    _check(gemma2, mesh, strategy, **kw)


def test_cross_entropy_with_ignore_index_matches_one_device():
    import torch.nn.functional as F

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, 16)
            self.h = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
            self.out = torch.nn.Linear(16, V)

        def forward(self, ids, labels):
            x = self.emb(ids)
            for layer in self.h:
                x = torch.tanh(layer(x)) + x
            return F.cross_entropy(self.out(x).reshape(-1, V), labels.reshape(-1), ignore_index=-100)

    torch.manual_seed(0)
    ids = torch.randint(0, V, (B, T))
    model = _step(Tiny(), ids, _labels(ids), optimizer="sgd")
    _check(model, "pp=2,dp=2", "pp+dp", microbatches=4, schedule="1f1b")


def test_section_simulation_takes_the_whole_batch_values(qwen2):
    from partita.cluster import simulate

    prog = partita.parallelize(qwen2.step, mesh="pp=2,dp=2", strategy="pp+dp", microbatches=4, unroll=False)
    assert simulate(prog, "selene").step_time > 0


def test_batch_statistics_of_activations_are_still_refused():
    # The mean over the batch rows of an activation reads a param: it truly mixes microbatches.
    class Centered(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.h = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

        def forward(self, x, y):
            h = self.h[0](x)
            h = h - h.mean(0, keepdim=True)
            return ((self.h[1](torch.tanh(h)) - y) ** 2).mean()

    from partita.autodiff.training import training_step
    from partita.frontend.torch_export import import_torch

    fwd = import_torch(Centered(), (torch.randn(8, 8), torch.randn(8, 8)))
    step = training_step(fwd, optimizer="sgd", lr=0.1)
    with pytest.raises(PipelineError, match="mixes the rows of different microbatches"):
        partita.parallelize(step, mesh="pp=2", strategy="pp", microbatches=4)


@pytest.mark.parametrize("mesh,strategy", [("pp=2", "pp"), ("pp=2,dp=2", "pp+dp")])
def test_a_param_no_stage_reads_is_still_updated(mesh, strategy):
    # DINOv2's mask token is unused without masked positions; AdamW's weight decay still moves
    # it, so some stage must run its update (with a zero gradient).
    from partita.autodiff.training import training_step
    from partita.backend.numpy_ref import run as run_np
    from partita.frontend.torch_export import import_torch

    class Unused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.token = torch.nn.Parameter(torch.randn(1, 8))
            self.h = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

        def forward(self, x):
            for layer in self.h:
                x = torch.tanh(layer(x))
            return x.square().mean()

    torch.manual_seed(0)
    step = training_step(import_torch(Unused(), (torch.randn(4, 8),)), optimizer="adamw", lr=0.1)
    inputs = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    want = run_np(step, {**{k: np.asarray(a) for k, a in step.weights.items()}, **inputs})
    got = partita.parallelize(step, mesh=mesh, strategy=strategy, microbatches=2).simulate(inputs)
    for o, w, v in zip(got, want, step.outputs):
        assert np.shape(o) == np.shape(w) and _rel(o, w) <= TOL, v.name


def test_two_params_with_one_shared_gradient_value_under_pp_and_dp():
    # Phi's and GPT-NeoX's parallel attention and MLP add their output biases to one sum: the
    # two biases' gradients are equal, and cse makes them one value whose dp all_reduce the
    # pipeline defers to once per step for both params.
    from partita.autodiff.training import training_step
    from partita.backend.numpy_ref import run as run_np
    from partita.frontend.torch_export import import_torch

    class Parallel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.h = torch.nn.ModuleList(torch.nn.ModuleDict({"a": torch.nn.Linear(8, 8), "m": torch.nn.Linear(8, 8)})
                                         for _ in range(2))

        def forward(self, x):
            for block in self.h:
                x = x + block["a"](torch.tanh(x)) + block["m"](torch.sin(x))
            return x.square().mean()

    torch.manual_seed(0)
    step = training_step(import_torch(Parallel(), (torch.randn(8, 8),)), optimizer="sgd", lr=0.1)
    inputs = {"x": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)}
    want = run_np(step, {**{k: np.asarray(a) for k, a in step.weights.items()}, **inputs})
    got = partita.parallelize(step, mesh="pp=2,dp=2", strategy="pp+dp", microbatches=2).simulate(inputs)
    for o, w, v in zip(got, want, step.outputs):
        assert _rel(o, w) <= TOL, v.name
