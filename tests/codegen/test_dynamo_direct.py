"""The torch.compile backend's inference call: the program it compiles is the import path's
(the same nodes, params frozen as constants, the same measured kernel choices), and dynamo calls
partita's runner itself where AOTAutograd's runtime wrapper would only pass inputs through."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch

import partita
import partita.codegen.dynamo as pd
from partita.codegen import CompiledProgram

# The import path of bench/bench_zoo.py (its IMPORT_PIPELINE).
IMPORT_PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


class _ConvNet(torch.nn.Module):
    """Two conv + batch norm + ReLU6 blocks, a depthwise one among them, and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU6(),
            torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU6(),
            torch.nn.Conv2d(8, 16, 1, bias=False), torch.nn.BatchNorm2d(16), torch.nn.ReLU6())
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


class _WritesItsInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)
        return torch.relu(self.fc(x))


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    pd.reset_stats()
    yield
    torch._dynamo.reset()


def _model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = _ConvNet().eval()
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model, torch.randn(2, 3, 16, 16)


def _ops(prog: CompiledProgram) -> list[str]:
    return [st[7].op for st in prog.program.steps]


def _run_backend(model: torch.nn.Module, x: torch.Tensor, calls: int, **options) -> list[torch.Tensor]:
    compiled = torch.compile(model, backend="partita", options=options or None)
    with torch.no_grad():
        return [compiled(x) for _ in range(calls)]


def test_backend_program_is_the_import_path_s_with_params_frozen():
    model, x = _model()
    with torch.no_grad():
        ref = model(x)
    outs = _run_backend(model, x, 3, choose="partita")
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    (rec,) = pd.stats().graphs
    assert rec.fallback is None and rec.program is not None and rec.choice is not None
    backend = rec.program
    # every param and buffer is a constant: the batch norms folded, the weights packed once
    assert rec.choice.frozen == len(list(model.parameters())) + len(list(model.buffers())) - 3  # 3 num_batches
    imported = CompiledProgram(partita.optimize(partita.import_torch(model, (x,)), IMPORT_PIPELINE), freeze=True)
    with torch.no_grad():
        torch.testing.assert_close(torch.as_tensor(imported([x])[0]), ref, rtol=1e-4, atol=1e-5)
    assert _ops(backend) == _ops(imported)
    assert "batch_norm" not in _ops(backend) and _ops(backend).count("conv2d_pointwise") == 3
    assert [i.role for i in backend.graph.inputs if i.role == "input"] == ["input"]
    # the same measured kernel choices, node for node
    picks = [c.picked for c in backend.kernel_choices()]
    assert picks == [c.picked for c in imported.kernel_choices()]


@contextlib.contextmanager
def _aot_wrapper_calls() -> Iterator[list]:
    """A list that gets an item for each call of an AOTAutograd runtime wrapper made meanwhile."""
    from torch._functorch._aot_autograd import runtime_wrappers

    calls: list = []
    create = runtime_wrappers._create_runtime_wrapper

    def counting(compiled_fn, **kw):
        inner = create(compiled_fn, **kw)

        def call(args):
            calls.append(1)
            return inner(args)
        return call

    runtime_wrappers._create_runtime_wrapper = counting
    try:
        yield calls
    finally:
        runtime_wrappers._create_runtime_wrapper = create


def test_dynamo_calls_the_runner_directly_and_matches_eager():
    model, x = _model()
    with torch.no_grad():
        ref = model(x)
    with _aot_wrapper_calls() as wrapped:
        outs = _run_backend(model, x, 2 * (pd.WARMUP_CALLS + pd.MAX_TIMED_CALLS) + 3)
    for out in outs:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    (rec,) = pd.stats().graphs
    assert rec.choice is not None and rec.choice.direct
    assert "called by dynamo directly" in pd.stats().report()
    assert wrapped == []   # AOTAutograd's runtime wrapper never ran a call


def test_direct_call_still_sees_a_param_written_in_place():
    model, x = _model()
    compiled = torch.compile(model, backend="partita", options={"choose": "partita"})
    with torch.no_grad():
        compiled(x)
        model.head.bias.add_(1.0)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    (rec,) = pd.stats().graphs
    assert rec.choice is not None and rec.choice.direct


def test_graph_that_writes_its_input_keeps_aot_s_wrapper():
    torch.manual_seed(0)
    model = _WritesItsInput().eval()
    x = torch.randn(3, 8)
    compiled = torch.compile(model, backend="partita", options={"choose": "partita"})
    with torch.no_grad(), _aot_wrapper_calls() as wrapped:
        for _ in range(3):
            a, b = x.clone(), x.clone()
            torch.testing.assert_close(compiled(a), model(b), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(a, b)   # the input written as eager writes it
    assert len(wrapped) == 3
    for rec in pd.stats().graphs:
        assert rec.choice is None or not rec.choice.direct


def _settled(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model compiled with the measured choice, called until its choice is made; its output."""
    compiled = torch.compile(model, backend="partita")
    with torch.no_grad():
        for _ in range(2 * (pd.WARMUP_CALLS + pd.MAX_TIMED_CALLS) + 1):
            out = compiled(x)
    return compiled, out


def test_a_param_whose_data_is_swapped_is_seen():
    # ``p.data = other`` keeps p's version counter: the frozen check compares addresses too.
    model, x = _model()
    compiled = torch.compile(model, backend="partita", options={"choose": "partita"})
    with torch.no_grad():
        compiled(x)
        model.head.weight.data = model.head.weight.data * 3.0
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
    (rec,) = pd.stats().graphs
    assert "frozen params changed" in rec.choice.text()


def test_a_param_replaced_or_stepped_is_seen_after_the_choice_is_made():
    # Once the measured choice is made, dynamo calls partita's runner without the chooser in
    # between; a param replaced (dynamo recompiles), stepped by an optimizer or loaded is still seen.
    model, x = _model()
    compiled, out = _settled(model, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        model.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()})
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        model.head.weight = torch.nn.Parameter(torch.randn_like(model.head.weight))
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_items_of_reads_a_run_of_positions_as_one_slice():
    xs = list("abcdefg")
    assert list(pd.items_of([2, 3, 4])(xs)) == ["c", "d", "e"]
    assert list(pd.items_of([0, 2, 5])(xs)) == ["a", "c", "f"]
    assert list(pd.items_of([6])(xs)) == ["g"] and list(pd.items_of([])(xs)) == []
