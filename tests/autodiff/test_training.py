"""Whole models: gradients against torch.autograd and AdamW training against a PyTorch loop.

Each model is imported with ``partita.import_torch``, turned into a training step with a
cross-entropy loss, and compared with the same computation in PyTorch eager from the same
initial weights and data: gradients to 1e-4 (relative), and 20 AdamW steps giving the same
loss curve and final parameters to 1e-4. Tensors are compared by their relative error
||got - want|| / ||want||: elementwise ratios of entries near zero measure only the summation
order of f32 arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import partita
from partita.autodiff import Trainer

RTOL = 1e-4


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.fc2 = nn.Linear(32, 32)
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x))
        h = torch.tanh(self.fc2(h)) + h
        return self.head(h)


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, 1, 1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, 2, 1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


class Logits(nn.Module):
    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits


def gpt2(layers: int = 2) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=64, n_head=4, vocab_size=128, n_positions=32, use_cache=False,
                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return Logits(GPT2LMHeadModel(cfg))


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=32, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0)
    return Logits(LlamaForCausalLM(cfg))


def _case(name: str):
    torch.manual_seed(0)
    if name == "mlp":
        model, x, classes = MLP(), torch.randn(16, 12), 5
        target = torch.randint(0, classes, (16,))
    elif name == "cnn":
        model, x, classes = SmallCNN(), torch.randn(4, 3, 16, 16), 10
        target = torch.randint(0, classes, (4,))
    else:
        model = gpt2() if name == "gpt2" else llama()
        x = torch.randint(0, 128, (2, 16))
        target = torch.randint(0, 128, (2, 16))
    return model.eval(), x, target


def _torch_loss(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


def assert_close(got, want, what: str) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)
    assert err <= RTOL, f"{what}: relative error {err:.2e} > {RTOL}"


def _input_name(g: partita.Graph) -> str:
    (name,) = [v.name for v in g.inputs if v.role == "input"]
    return str(name)


MODELS = ["mlp", "cnn", "gpt2", "llama"]


@pytest.mark.parametrize("name", MODELS)
def test_gradients_match_torch_autograd(name: str) -> None:
    model, x, target = _case(name)
    fwd = partita.import_torch(model, (x,))
    step = partita.training_step(fwd, loss="cross_entropy", optimizer=None)
    feed = {_input_name(fwd): x.numpy(), "target": target.numpy()}
    outs = partita.run(step, feed, backend="torch")
    names = [str(v.name)[: -len(".grad")] for v in step.outputs[1:]]
    loss = _torch_loss(model, x, target)
    params = dict(model.named_parameters())
    want = torch.autograd.grad(loss, [params[n] for n in names])
    np.testing.assert_allclose(float(outs[0]), loss.item(), rtol=RTOL)
    assert set(names) == set(params), "every parameter gets a gradient"
    for n, got, w in zip(names, outs[1:], want):
        assert_close(got.numpy(), w.numpy(), f"gradient of {n}")


@pytest.mark.parametrize("backend", ["torch", "codegen"])
@pytest.mark.parametrize("name", MODELS)
def test_twenty_adamw_steps_match_a_pytorch_loop(name: str, backend: str) -> None:
    """Also with generated code (backend="codegen": fused elementwise kernels in the forward and
    backward, the AdamW update as one kernel per parameter, in place)."""
    model, x, target = _case(name)
    fwd = partita.import_torch(model, (x,))
    # eps=1e-6 rather than 1e-8: the key bias of attention has an exactly zero gradient (it
    # shifts every score of a row equally), so its f32 gradient is rounding noise of about 1e-9,
    # which Adam with eps=1e-8 turns into full-size steps of random sign in either
    # implementation. With eps=1e-6 that noise stays noise; every other parameter is unaffected.
    opts = dict(lr=3e-3, weight_decay=0.01, eps=1e-6)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", **opts)
    partita.verify(partita.parse(partita.print_graph(step)))
    trainer = Trainer(step, backend=backend)
    if backend == "codegen":
        n_params = sum(1 for v in step.inputs if v.role == "param")
        assert len(trainer._program.optimizer_kernels) == n_params
        # (the CNN's step has no two elementwise ops in a row: relu and relu_grad stand alone)
        assert trainer._program.kernels or name == "cnn", "elementwise groups of the step run as fused kernels"
    opt = torch.optim.AdamW(model.parameters(), **opts)
    feed = {_input_name(fwd): x.numpy(), "target": target.numpy()}
    ours, theirs = [], []
    for _ in range(20):
        ours.append(trainer.step(feed))
        opt.zero_grad()
        loss = _torch_loss(model, x, target)
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    np.testing.assert_allclose(ours, theirs, rtol=RTOL)
    assert theirs[-1] < theirs[0], "the loop trains"
    w = trainer.weights()
    for n, p in model.named_parameters():
        assert_close(w[n], p.detach().numpy(), f"parameter {n} after 20 steps")


def test_sgd_with_momentum_matches_torch() -> None:
    model, x, target = _case("mlp")
    fwd = partita.import_torch(model, (x,))
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.05, momentum=0.9,
                                 weight_decay=1e-3, nesterov=True)
    trainer = Trainer(step, backend="numpy")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=True)
    for _ in range(5):
        ours = trainer.step({"x": x.numpy(), "target": target.numpy()})
        opt.zero_grad()
        loss = _torch_loss(model, x, target)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(ours, loss.item(), rtol=RTOL)
    for n, p in model.named_parameters():
        assert_close(trainer.weights()[n], p.detach().numpy(), f"parameter {n}")
