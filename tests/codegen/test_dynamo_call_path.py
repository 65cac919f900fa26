"""The per-call path of ``torch.compile(backend="partita")``: what runs an inference graph once the
choice is made, and the torch executor's binding of inputs that need no conversion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import partita.codegen.dynamo as pd
from partita.backend.torch_exec import TorchProgram
from partita.ir.diagnostics import ExecutionError


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    pd.reset_stats()
    yield
    torch._dynamo.reset()


def test_aten_choice_runs_dynamo_s_own_graph_not_partita():
    # choose="aten" on an inference graph: dynamo's graph runs, partita's program never does.
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(3, 8)
    ran = []
    run = pd._Runner.__call__
    pd._Runner.__call__ = lambda self, args: (ran.append(1), run(self, args))[1]
    try:
        compiled = torch.compile(model, backend="partita", options={"choose": "aten"})
        with torch.no_grad():
            for _ in range(3):
                assert torch.allclose(compiled(x), model(x), atol=1e-6)
    finally:
        pd._Runner.__call__ = run
    assert ran == []
    (rec,) = pd.stats().graphs
    assert rec.choice is not None and rec.choice.picked == "aten"


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_measured_inference_graph_matches_eager_on_every_call(mode):
    torch.manual_seed(0)
    model = _Net().eval()
    x = torch.randn(3, 8)
    compiled = torch.compile(model, backend="partita")
    with mode():
        ref = model(x)
        for _ in range(2 * (pd.WARMUP_CALLS + pd.MAX_TIMED_CALLS) + 2):
            out = compiled(x)
            assert torch.allclose(out, ref, atol=1e-5)
    (rec,) = pd.stats().graphs
    assert rec.choice is not None and rec.choice.picked in ("partita", "aten")
    assert len(rec.choice.partita_ms) == len(rec.choice.aten_ms)
    assert pd.TIMED_CALLS <= len(rec.choice.aten_ms) <= pd.MAX_TIMED_CALLS
    assert f"runs {rec.choice.picked}" in pd.stats().report()


ADD = """graph @add(%a: f32[2,3], %w: f32[2,3] param) -> (f32[2,3]) {
  %0 = add(%a, %w) : f32[2,3]
  return %0
}"""


def test_torch_program_binds_ready_tensors_and_still_checks_the_rest():
    import partita

    g = partita.parse(ADD, "add.pir")
    g.weights["w"] = np.ones((2, 3), np.float32)
    prog = TorchProgram(g)
    a = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    w = {"w": torch.full((2, 3), 2.0)}
    (out,) = prog([a], w)                   # the ready path: tensors of the inputs' dtypes and shapes
    assert torch.equal(out, a + 2.0)
    (out,) = prog([a.numpy()], w)           # converted through bind_inputs
    assert torch.equal(out, a + 2.0)
    (out,) = prog([a])                      # the graph's own weights
    assert torch.equal(out, a + 1.0)
    with pytest.raises(ExecutionError, match="expects"):
        prog([a.double()], w)
    with pytest.raises(ExecutionError, match="takes 1 input"):
        prog([a, a], w)
    with pytest.raises(ExecutionError, match="expects"):
        prog([a], {"w": torch.ones(3, 2)})


class _Hard(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.hardswish(x) * 2.0


def test_the_aten_candidate_of_an_inference_graph_is_the_model_s_own_calls():
    # partita's decompositions split hardswish into clamps and adds; dynamo's graph calls it whole,
    # as eager does: the ATen candidate must be the latter (never slower than not compiling).
    x = torch.randn(64)
    compiled = torch.compile(_Hard().eval(), backend="partita", options={"choose": "aten"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), torch.nn.functional.hardswish(x) * 2.0)
        with torch.profiler.profile() as prof:
            compiled(x)
    names = {e.key for e in prof.key_averages()}
    assert "aten::hardswish" in names and "aten::clamp" not in names, sorted(names)
