"""The torch executor's per-call shortcuts agree with the general path: the generated input
binding (``bind_function``) with ``_bind_ready``, and the result checks a step gets or not."""

from __future__ import annotations

import torch

from partita.backend import torch_exec as TE
from partita.backend.torch_exec import TorchProgram
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES

F32 = DTYPES["f32"]


def _plan() -> tuple:
    data = [(0, torch.float32, (2, 3)), (1, torch.int64, (4,))]
    params = [(2, torch.float32, (3,), "w"), (3, torch.float32, (3, 3), "a.b")]
    return data, params


def test_generated_binding_agrees_with_bind_ready_on_every_case():
    plan = _plan()
    bind = TE.bind_function(plan)
    x, i = torch.randn(2, 3), torch.arange(4)
    w, ab = torch.randn(3), torch.randn(3, 3)
    good = {"w": w, "a.b": ab}
    cases = [([x, i], good), ((x, i), good), ([x, i], None), ([x, i], [w, ab]), ([x], good),
             ([x, i.float()], good), ([x.t(), i], good), ([x.numpy(), i], good), ([x, i], {"w": w}),
             ([x, i], {"w": w.double(), "a.b": ab}), ([x, i], {"w": w, "a.b": ab[:2]}), ({"x": x}, good),
             ([torch.nn.Parameter(x), i], {"w": torch.nn.Parameter(w), "a.b": ab})]
    for inputs, weights in cases:
        env_a, env_b = [None] * 4, [None] * 4
        got = bind(env_a, inputs, weights)
        want = TE._bind_ready(plan, env_b, inputs, weights)
        assert got == want, (inputs, weights)
        if want:
            assert all(p is q for p, q in zip(env_a, env_b))
    no_params = TE.bind_function(([(0, torch.float32, (2, 3))], []))
    env = [None]
    assert no_params(env, [x], None) and env[0] is x


def _graph():
    b = Builder()
    x = b.input("x", TensorType((3,), F32))
    y = b.exp(x)
    return verify(b.ret(b.add(y, x)))


def test_a_step_declaring_an_exact_result_gets_no_checks_and_others_keep_them():
    prog = TorchProgram(_graph())
    x = torch.randn(3)
    want = torch.exp(x) + x
    fn, *rest = prog.steps[0]

    def exact(args, attrs):
        return fn(args, attrs)
    exact.exact_result = True  # type: ignore[attr-defined]
    prog.steps[0] = (exact, *rest)
    assert torch.allclose(prog([x])[0], want)
    src = prog._run._source
    assert "D0" not in src and "D1" in src
    # a step returning a one-element list of another dtype is still unwrapped and converted
    prog.steps[0] = (lambda args, attrs: [fn(args, attrs).double()], *rest)
    out = prog([x])[0]
    assert out.dtype is torch.float32 and torch.allclose(out, want)

