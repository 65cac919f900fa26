"""Mixture-of-experts models from transformers: the static dispatch form (partita/frontend/moe.py),
their import, their training step and its expert-parallel plan."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch

import partita
from partita.frontend import FrontendError
from partita.frontend.moe import capacity, static_experts

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _init_experts(model) -> None:
    # transformers leaves stacked expert weights as torch.empty: give them values.
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        for name in ("gate_up_proj", "down_proj"):
            p = getattr(m, name, None)
            if isinstance(p, torch.nn.Parameter) and p.dim() == 3:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)


@functools.cache
def _model(kind: str):
    torch.manual_seed(0)
    if kind == "mixtral":
        cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                         num_experts_per_tok=2, vocab_size=128, max_position_embeddings=64)
        model = transformers.MixtralForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2MoeConfig(hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                                          shared_expert_intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                          num_experts_per_tok=2, vocab_size=128, max_position_embeddings=64)
        model = transformers.Qwen2MoeForCausalLM(cfg)
    model.eval()
    _init_experts(model)
    return model, torch.randint(0, 128, (4, 8))


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("groups", [1, 2, 16])
def test_dispatch_form_equals_the_eager_layer(groups):
    model, ids = _model("mixtral")
    with torch.no_grad():
        want = model(ids).logits
        with static_experts(model, groups) as n:
            got = model(ids).logits
    assert n == 2
    assert _rel(got, want) < 1e-5
    # The configs are restored.
    assert model.config._experts_implementation != "partita_dispatch"


def test_a_capacity_factor_drops_tokens_as_gshard_does():
    model, ids = _model("mixtral")
    assert capacity(8, 2, 4, None) == 8 and capacity(8, 2, 4, 1.0) == 4 and capacity(8, 2, 4, 0.1) == 1
    with torch.no_grad():
        want = model(ids).logits
        with static_experts(model, 1, capacity_factor=0.5):
            dropped = model(ids).logits
        with static_experts(model, 1, capacity_factor=4.0):   # C = all the group's tokens: none dropped
            kept = model(ids).logits
    assert _rel(dropped, want) > 1e-3
    assert _rel(kept, want) < 1e-5


def test_bad_groups_and_capacity_are_refused():
    model, ids = _model("mixtral")
    with pytest.raises(FrontendError, match="32 tokens do not split into 3 groups"):
        partita.import_torch(model, (ids,), moe_groups=3)
    with pytest.raises(FrontendError, match="capacity_factor must be > 0"):
        partita.import_torch(model, (ids,), capacity_factor=0.0)


@functools.cache
def _imported(kind: str, groups: int):
    model, ids = _model(kind)
    return partita.import_torch(model, (ids,), moe_groups=groups)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2-moe"])
def test_moe_models_import_and_match_eager(kind):
    model, ids = _model(kind)
    g = _imported(kind, 2)
    partita.verify(g)
    with torch.no_grad():
        want = model(ids).logits
    for backend in ("numpy", "torch"):
        assert _rel(partita.run(g, [ids.numpy()], backend=backend)[0], want) < 1e-5
    # The experts are one batched matmul per projection, not a loop over experts.
    assert sum(1 for n in g.nodes if n.op == "matmul" and n.operands[1].type.rank == 3) >= 4


# AdamW on the Mixtral cases; SGD with the attention biases of Qwen2, whose key bias has a
# gradient that is zero but for rounding (softmax ignores a shift), which Adam would magnify.
@pytest.mark.parametrize("kind,mesh,strategy,groups,optimizer", [
    ("mixtral", "ep=2", "ep", 2, "adamw"), ("mixtral", "dp=2,ep=2", "dp+ep", 4, "adamw"),
    ("qwen2-moe", "ep=2,tp=2", "ep+megatron", 2, "sgd")])
def test_moe_models_train_expert_parallel(kind, mesh, strategy, groups, optimizer):
    g = _imported(kind, groups)
    kw = {"eps": 1e-6} if optimizer == "adamw" else {"lr": 0.1}
    step = partita.training_step(g, loss="cross_entropy", optimizer=optimizer, **kw)
    target = torch.randint(0, 128, (4, 8), generator=torch.Generator().manual_seed(2))
    feed = {"input_ids": _model(kind)[1].numpy(), "target": target.numpy()}
    prog = partita.parallelize(step, mesh, strategy)
    want = partita.run(step, feed, step.weights)
    got = prog.simulate(feed, step.weights)
    for v, a, b in zip(step.outputs, got, want):
        err = float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))
        assert err <= 1e-5, f"%{v.name}: {err:.2e}"
    assert sum(1 for n in prog.local.nodes if n.op == "all_to_all") == 8
