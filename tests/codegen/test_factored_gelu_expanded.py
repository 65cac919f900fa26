"""GPT-2's ``gelu_new`` written out (``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``)
after a linear layer becomes ``gelu {approximate="tanh"}`` before ``fuse-library``
(codegen/factored_gelu.py), so the GEMM takes it as its epilogue. Odd shapes; the reference
interpreter before and after, torch's ``gelu(approximate="tanh")``, the compiled program, and a
torch module imported through the import pipeline against eager."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import partita
from partita.codegen import CompiledProgram
from partita.codegen.factored_gelu import take_factored_gelu
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731
IMPORT_PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


def _expanded_gelu(b, x, assoc: int, cube: int):
    """``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * cube)))``, the cube as ``pow(x, 3)``
    (``cube == 0``) or ``x * x * x``, the outer product in the association asked."""
    c = lambda v: b.full(shape=(), value=v)  # noqa: E731
    x3 = b.pow(x, c(3.0)) if cube == 0 else b.mul(b.mul(x, x), x)
    core = b.add(b.tanh(b.mul(b.add(x, b.mul(x3, c(0.044715))), c(math.sqrt(2.0 / math.pi)))), c(1.0))
    if assoc == 0:
        return b.mul(b.mul(c(0.5), x), core)
    if assoc == 1:
        return b.mul(x, b.mul(c(0.5), core))
    return b.mul(b.mul(x, core), c(0.5))


@pytest.mark.parametrize("assoc,cube", [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1)])
def test_an_expanded_gelu_after_a_linear_layer_becomes_its_epilogue(assoc, cube):
    b = Builder()
    x = b.input("x", T(3, 5, 19))
    w, bias = b.param("w", T(19, 41)), b.param("bias", T(41))
    h = b.reshape(b.add(b.matmul(b.reshape(x, shape=(15, 19)), w), bias), shape=(3, 5, 41))
    g = verify(b.ret(_expanded_gelu(b, h, assoc, cube)))
    inputs = random_inputs(g, 11)
    before = run_reference(g, inputs)
    probe = g.clone()
    assert take_factored_gelu(probe) == 1
    ops = [n.op for n in verify(probe).nodes]
    assert "tanh" not in ops and "gelu" in ops
    np.testing.assert_allclose(run_reference(probe, inputs)[0], before[0], rtol=1e-5, atol=1e-5)
    hx = torch.from_numpy(inputs["x"]).reshape(15, 19) @ torch.from_numpy(inputs["w"]) + torch.from_numpy(inputs["bias"])
    want = torch.nn.functional.gelu(hx, approximate="tanh").reshape(3, 5, 41).numpy()
    np.testing.assert_allclose(before[0], want, rtol=1e-5, atol=1e-5)
    out = verify(PassManager.parse("fuse-library,fuse-kernels,dce").run(g))
    lin = [n for n in out.nodes if n.op == "linear_pointwise"]
    assert len(lin) == 1 and lin[0].attrs["unary"] == "gelu_tanh" and "tanh" not in [n.op for n in out.nodes]
    np.testing.assert_allclose(run_reference(out, inputs)[0], want, rtol=1e-5, atol=1e-5)
    prog = CompiledProgram(out)
    got = prog({k: torch.from_numpy(v) for k, v in inputs.items() if k == "x"},
               {k: torch.from_numpy(v) for k, v in inputs.items() if k != "x"})
    np.testing.assert_allclose(got[0].numpy(), want, rtol=1e-5, atol=1e-5)


def test_an_expanded_gelu_with_another_cube_coefficient_is_left_alone():
    b = Builder()
    x = b.input("x", T(7, 13))
    c = lambda v: b.full(shape=(), value=v)  # noqa: E731
    core = b.add(b.tanh(b.mul(b.add(x, b.mul(b.pow(x, c(3.0)), c(0.05))), c(math.sqrt(2.0 / math.pi)))), c(1.0))
    g = verify(b.ret(b.mul(b.mul(c(0.5), x), core)))
    assert take_factored_gelu(g) == 0 and "tanh" in [n.op for n in g.nodes]


class _NewGeluMLP(torch.nn.Module):
    """GPT-2's MLP: c_fc, ``gelu_new`` written out as HF's NewGELUActivation, c_proj."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.proj = torch.nn.Linear(23, 53), torch.nn.Linear(53, 23)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        act = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return self.proj(act)


def test_an_imported_new_gelu_mlp_runs_its_gelu_in_the_first_linear_layer():
    torch.manual_seed(0)
    model = _NewGeluMLP().eval()
    x = torch.randn(3, 7, 23)
    g = partita.optimize(partita.import_torch(model, (x,)), IMPORT_PIPELINE)
    ops = [n.op for n in g.nodes]
    assert "tanh" not in ops and "fused" not in ops, ops
    assert [n.attrs.get("unary") for n in g.nodes if n.op == "linear_pointwise"][:1] == ["gelu_tanh"]
    with torch.no_grad():
        want = model(x)
    got = CompiledProgram(g, freeze=True)([x])[0]
    assert float((got - want).abs().max()) <= 1e-5
