"""The torch executor runs a program as one generated straight-line function."""

from __future__ import annotations

import pytest
import torch

import partita
from partita.backend.torch_exec import TorchProgram
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES

F32 = DTYPES["f32"]


def _graph():
    b = Builder()
    x = b.input("x", TensorType((3,), F32))
    y = b.exp(x)
    z = b.add(y, x)
    return verify(b.ret(z, y))


def test_source_has_one_call_per_step_and_no_loop():
    prog = TorchProgram(_graph())
    x = torch.randn(3)
    out = prog([x])
    assert torch.allclose(out[0], torch.exp(x) + x) and torch.allclose(out[1], torch.exp(x))
    src = prog._run._source
    assert "for " not in src and src.count("F0(") == 1 and src.count("F1(") == 1


def test_replacing_a_step_after_a_call_takes_effect():
    prog = TorchProgram(_graph())
    x = torch.randn(3)
    prog([x])
    fn, *rest = prog.steps[1]
    prog.steps[1] = (lambda args, attrs: fn(args, attrs) * 2, *rest)
    assert torch.allclose(prog([x])[0], 2 * (torch.exp(x) + x))


def test_an_error_in_a_step_names_its_node():
    prog = TorchProgram(_graph())
    fn, *rest = prog.steps[1]

    def boom(args, attrs):
        raise RuntimeError("kernel exploded")
    prog.steps[1] = (boom, *rest)
    with pytest.raises(partita.PartitaError, match=r"add") as e:
        prog([torch.randn(3)])
    assert "kernel exploded" in str(e.value)


def test_a_static_reshape_is_a_method_call_in_place_and_a_replaced_one_is_called():
    b = Builder()
    x = b.input("x", TensorType((2, 6), F32))
    y = b.reshape(b.exp(x), shape=[3, -1])
    g = verify(b.ret(b.add(y, y)))
    prog = TorchProgram(g)
    x = torch.randn(2, 6)
    (out,) = prog([x])
    assert torch.allclose(out, 2 * torch.exp(x).reshape(3, 4))
    src = prog._run._source
    assert ".reshape(S1)" in src and "F1(" not in src     # the step's target shape, [3, 4]
    k = next(i for i, st in enumerate(prog.steps) if st[7].op == "reshape")
    fn, *rest = prog.steps[k]
    prog.steps[k] = (lambda args, attrs: fn(args, attrs) * 0, *rest)   # a wrapped step is called
    (out,) = prog([x])
    assert float(out.abs().max()) == 0.0 and f"F{k}(" in prog._run._source
