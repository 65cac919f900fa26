"""What ``grad`` says when it cannot do what it is asked, and the grad/optimizer passes from text.

Every refusal is one ``AutodiffError`` (a ``PartitaError``) whose message names the value or
node at fault and its model source line (``loc("model.py":N)`` in the text), and says what to
change. A refused ``grad`` leaves the graph as it was. The second half drives ``grad``,
``adamw`` and ``sgd`` through pass pipelines written as text and checks the step they build
against the same update written in NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.autodiff import AutodiffError, grad
from partita.autodiff.grad import NOT_DIFFERENTIABLE
from partita.ir.diagnostics import PartitaError
from partita.ops.registry import OPS, OpDef, register


def parse(text: str):
    return partita.parse(text, "m.pir")


def refuse(text: str, *args, **kwargs) -> str:
    """Run grad on ``text`` expecting exactly one AutodiffError; check that the graph was
    left unchanged and return the message."""
    g = parse(text)
    before = g.clone()
    with pytest.raises(AutodiffError) as info:
        grad(g, *args, **kwargs)
    assert isinstance(info.value, PartitaError)
    assert g.diff(before) is None, "a refused grad must not leave half a backward pass behind"
    assert len(g.outputs) == len(before.outputs)
    partita.verify(g)
    return str(info.value)


# --- the loss ---------------------------------------------------------------------------------

def test_non_scalar_loss_names_value_producer_and_line():
    msg = refuse("""
graph @m(%x: f32[4,3], %w: f32[3,2] param) -> (f32[4,2]) {
  %y = matmul(%x, %w) : f32[4,2] loc("model.py":12)
  return %y
}""")
    assert "%y" in msg
    assert "matmul" in msg and "model.py:12" in msg
    assert "f32[4,2]" in msg
    assert "scalar" in msg and "mean or sum" in msg


def test_integer_loss():
    msg = refuse("""
graph @m(%x: f32[4,3], %i: i64[4], %w: f32[3,2] param) -> (i64[]) {
  %y = matmul(%x, %w) : f32[4,2] loc("model.py":12)
  %n = sum(%i) : i64[] loc("model.py":13)
  return %n
}""")
    assert "%n" in msg and "sum at model.py:13" in msg
    assert "i64" in msg and "float loss" in msg


def test_graph_without_outputs():
    msg = refuse("""
graph @m(%x: f32[4,3], %w: f32[3,2] param) -> () {
  %y = matmul(%x, %w) : f32[4,2] loc("model.py":12)
  return
}""")
    assert "@m has no outputs" in msg and "scalar loss" in msg


@pytest.mark.parametrize("index", [1, 5, -1])
def test_loss_index_out_of_range(index):
    msg = refuse("""
graph @m(%x: f32[3], %w: f32[3] param) -> (f32[]) {
  %y = mul(%x, %w) : f32[3] loc("model.py":12)
  %l = sum(%y) : f32[] loc("model.py":13)
  return %l
}""", loss_index=index)
    assert "1 output(s)" in msg and f"no output {index}" in msg


def test_loss_that_depends_on_no_parameter():
    msg = refuse("""
graph @m(%x: f32[3], %w: f32[3] param) -> (f32[]) {
  %y = mul(%x, %w) : f32[3] loc("model.py":11)
  %l = sum(%x) : f32[] loc("model.py":12)
  return %l
}""")
    assert "%l" in msg and "%w" in msg and "does not depend" in msg
    assert "sum at model.py:12" in msg


def test_loss_through_integers_only_is_not_a_dependence():
    # argmax cuts the float path: the loss is a function of %w, but a piecewise-constant one.
    msg = refuse("""
graph @m(%x: f32[4,3], %w: f32[3,2] param) -> (f32[]) {
  %y = matmul(%x, %w) : f32[4,2] loc("model.py":11)
  %a = argmax(%y) {axes=[1]} : i64[4] loc("model.py":12)
  %f = cast(%a) {dtype=f32} : f32[4] loc("model.py":13)
  %l = sum(%f) : f32[] loc("model.py":14)
  return %l
}""")
    assert "does not depend" in msg and "%w" in msg and "model.py:14" in msg


UNUSED = """
graph @m(%x: f32[3], %w: f32[3] param, %v: f32[2] param, %u: f32[3,3] param) -> (f32[]) {
  %y = mul(%x, %w) : f32[3] loc("model.py":12)
  %l = sum(%y) : f32[] loc("model.py":13)
  return %l
}"""


def test_unused_error_lists_every_unused_parameter():
    msg = refuse(UNUSED, unused="error")
    assert "%v" in msg and "%u" in msg
    assert "%w" not in msg
    assert "unused='zeros'" in msg


def test_unused_zeros_gives_exact_zero_gradients():
    g = parse(UNUSED)
    res = grad(g, unused="zeros")
    assert list(res.grads) == ["w", "v", "u"]
    assert [v.name for v in g.outputs[1:]] == ["w.grad", "v.grad", "u.grad"]
    partita.verify(g)
    x = np.array([1.0, -2.0, 3.0], np.float32)
    w = np.array([0.5, 0.25, 2.0], np.float32)
    feed = {"x": x, "w": w, "v": np.ones(2, np.float32), "u": np.ones((3, 3), np.float32)}
    for backend in ("numpy", "torch"):
        outs = [np.asarray(o) for o in partita.run(g, feed, backend=backend)]
        np.testing.assert_allclose(outs[0], (x * w).sum(), rtol=1e-6)
        np.testing.assert_array_equal(outs[1], x)
        assert outs[2].shape == (2,) and outs[3].shape == (3, 3)
        assert not outs[2].any() and not outs[3].any()


def test_unknown_unused_mode():
    with pytest.raises(AutodiffError, match="unused must be 'zeros' or 'error'"):
        grad(parse(UNUSED), unused="skip")  # type: ignore[arg-type]


# --- ops the gradient cannot pass -------------------------------------------------------------

NO_RULE_OP = "test_double_without_vjp"


@pytest.fixture
def op_without_vjp():
    """A float elementwise op with no vjp rule, registered for one test only."""
    assert NO_RULE_OP not in OPS
    register(OpDef(name=NO_RULE_OP, operands=("x",), infer=lambda ts, attrs: ts[0],
                   reference=lambda args, attrs: args[0] * 2, torch=lambda args, attrs: args[0] * 2,
                   elementwise=True, doc="2 * x, without a vjp rule"))
    try:
        yield NO_RULE_OP
    finally:
        del OPS[NO_RULE_OP]


def test_op_without_vjp_rule_reached(op_without_vjp):
    msg = refuse(f"""
graph @m(%x: f32[3], %w: f32[3] param) -> (f32[]) {{
  %y = mul(%x, %w) : f32[3] loc("model.py":11)
  %z = {op_without_vjp}(%y) : f32[3] loc("model.py":12)
  %l = sum(%z) : f32[] loc("model.py":13)
  return %l
}}""")
    assert f"{op_without_vjp} at model.py:12" in msg
    assert "has no vjp rule" in msg and "%z" in msg
    assert "add a vjp rule" in msg


def test_op_without_vjp_rule_off_the_gradient_path_is_fine(op_without_vjp):
    # The op only sees a non-param input: the gradient never reaches it.
    g = parse(f"""
graph @m(%x: f32[3], %w: f32[3] param) -> (f32[]) {{
  %z = {op_without_vjp}(%x) : f32[3] loc("model.py":12)
  %y = mul(%z, %w) : f32[3] loc("model.py":13)
  %l = sum(%y) : f32[] loc("model.py":14)
  return %l
}}""")
    grad(g)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    out = partita.run(g, {"x": x, "w": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(out[1], 2 * x)


def test_not_differentiable_op_with_float_results_reached():
    # The optimizer updates are first-order only: differentiating through one is refused.
    assert OPS["sgd_update"].vjp == NOT_DIFFERENTIABLE
    msg = refuse("""
graph @m(%x: f32[3], %w: f32[3] param) -> (f32[]) {
  %y = sgd_update(%w, %x) {lr=0.1} : f32[3] loc("model.py":12)
  %l = sum(%y) : f32[] loc("model.py":13)
  return %l
}""")
    assert "sgd_update at model.py:12" in msg
    assert "is not differentiable" in msg and "%y" in msg


def test_vjp_rule_that_is_not_a_function_is_an_autodiff_error():
    # A rule registered as a string other than NOT_DIFFERENTIABLE (a misspelling) was called,
    # which raised TypeError: 'str' object is not callable.
    from partita.autodiff.rules import RULES
    with RULES.override("exp", "not_differentiable"):
        msg = refuse("""
graph @m(%x: f32[3], %w: f32[3] param) -> (f32[]) {
  %y = mul(%x, %w) : f32[3] loc("model.py":12)
  %z = exp(%y) : f32[3] loc("model.py":13)
  %l = sum(%z) : f32[] loc("model.py":14)
  return %l
}""")
    assert "vjp rule of 'exp'" in msg and "'not_differentiable'" in msg
    assert "neither a function nor NOT_DIFFERENTIABLE" in msg


# --- wrt --------------------------------------------------------------------------------------

WRT = """
graph @m(%x: f32[3], %ids: i64[3], %weight: f32[3] param) -> (f32[]) {
  %y = mul(%x, %weight) : f32[3] loc("model.py":12)
  %l = sum(%y) : f32[] loc("model.py":13)
  return %l
}"""


def test_wrt_unknown_input_suggests_the_closest():
    msg = refuse(WRT, ["wieght"])
    assert "'wieght'" in msg and "did you mean 'weight'" in msg
    assert "x, ids, weight" in msg


def test_wrt_integer_input():
    msg = refuse(WRT, ["ids"])
    assert "%ids" in msg and "i64" in msg and "float inputs" in msg


def test_wrt_non_param_float_input_is_allowed():
    g = parse(WRT)
    res = grad(g, ["x"])
    assert list(res.grads) == ["x"]
    x, w = np.ones(3, np.float32), np.array([1.0, 2.0, 3.0], np.float32)
    out = partita.run(g, {"x": x, "ids": np.zeros(3, np.int64), "weight": w})
    np.testing.assert_array_equal(out[1], w)


def test_grad_pass_errors_keep_their_message():
    g = parse(WRT)
    # The pass manager wraps it in a PassError naming the pass; the reason stays whole.
    with pytest.raises(PartitaError, match=r"pass 'grad\{wrt=wieght\}' failed: .*did you mean 'weight'"):
        partita.optimize(g, passes="grad{wrt=wieght}", reproducer_dir=None)


# --- the passes from the text form ------------------------------------------------------------

MLP = """
graph @mlp(%x: f32[4,3], %w1: f32[3,5] param, %b1: f32[5] param, %w2: f32[5,2] param) -> (f32[]) {
  %0 = matmul(%x, %w1) : f32[4,5] loc("model.py":10)
  %1 = add(%0, %b1) : f32[4,5] loc("model.py":11)
  %h = tanh(%1) : f32[4,5] loc("model.py":12)
  %3 = matmul(%h, %w2) : f32[4,2] loc("model.py":13)
  %4 = mul(%3, %3) : f32[4,2] loc("model.py":14)
  %l = mean(%4) : f32[] loc("model.py":15)
  return %l
}"""
PARAMS = ("w1", "b1", "w2")


def mlp():
    g = parse(MLP)
    rng = np.random.default_rng(0)
    for name in PARAMS:
        v = next(i for i in g.inputs if i.name == name)
        g.weights[name] = rng.standard_normal(v.type.shape).astype(np.float32)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    return g, x


def numpy_grads(w: dict, x: np.ndarray) -> tuple[float, dict]:
    """The loss of MLP and its gradients, by hand (f64)."""
    x = x.astype(np.float64)
    w1, b1, w2 = (w[n].astype(np.float64) for n in PARAMS)
    h = np.tanh(x @ w1 + b1)
    y = h @ w2
    dy = 2 * y / y.size
    dh = dy @ w2.T
    d1 = dh * (1 - h * h)
    return float((y * y).mean()), {"w1": x.T @ d1, "b1": d1.sum(0), "w2": h.T @ dy}


def check_step_text(g) -> None:
    partita.verify(g)
    text = partita.print_graph(g)
    back = partita.parse(text, "step.pir")
    assert g.diff(back) is None
    assert partita.print_graph(back) == text


def run_both(g, feed: dict) -> list[list[np.ndarray]]:
    return [[np.asarray(o) for o in partita.run(g, feed, backend=b)] for b in ("numpy", "torch")]


def test_grad_adamw_pipeline_from_text():
    g, x = mlp()
    w0 = {n: g.weights[n].copy() for n in PARAMS}
    step = partita.optimize(g, passes="grad,adamw{lr=0.01}")
    states = [f"{p}.{s}" for p in PARAMS for s in ("exp_avg", "exp_avg_sq")]
    assert [v.name for v in step.inputs] == ["x", *PARAMS, "step", *states]
    assert all(v.role == "state" for v in step.inputs[4:])
    names = [v.name for v in step.outputs]
    assert names == ["l", *(f"{p}.1" for p in PARAMS), *(f"{s}.1" for s in states), "step.1"]
    # Each new version aliases the input it replaces, in the printed signature too.
    by_name = {v.name: v for v in step.inputs}
    assert [a.name if a is not None else None for a in step.output_aliases] == \
        [None, *PARAMS, *states, "step"]
    header = partita.print_graph(step).split("{", 1)[0]
    for old in (*PARAMS, *states, "step"):
        assert f"aliases(%{old})" in header
    # The optimizer state starts at zero, as torch.optim's does.
    for name in ("step", *states):
        np.testing.assert_array_equal(step.weights[name], np.zeros(by_name[name].type.shape, np.float32))
    check_step_text(step)

    feed = {"x": x, **{n: np.asarray(step.weights[n]) for n in step.weights}}
    loss, grads = numpy_grads(w0, x)
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-8, 1e-2
    for outs in run_both(step, feed):
        np.testing.assert_allclose(outs[0], loss, rtol=1e-5)
        got = dict(zip(names, outs))
        for p in PARAMS:
            g_ = grads[p]
            m = (1 - b1) * g_
            v = (1 - b2) * g_ * g_
            want = w0[p] * (1 - lr * wd) - lr / (1 - b1) * m / (np.sqrt(v) / np.sqrt(1 - b2) + eps)
            np.testing.assert_allclose(got[f"{p}.1"], want, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(got[f"{p}.exp_avg.1"], m, rtol=1e-4, atol=1e-7)
            np.testing.assert_allclose(got[f"{p}.exp_avg_sq.1"], v, rtol=1e-4, atol=1e-9)
        assert float(got["step.1"]) == 1.0


def test_grad_wrt_sgd_momentum_pipeline_from_text():
    g, x = mlp()
    w0 = {n: g.weights[n].copy() for n in PARAMS}
    step = partita.optimize(g, passes="grad{wrt=w1,w2},sgd{lr=0.1,momentum=0.9}")
    assert [v.name for v in step.inputs] == ["x", *PARAMS, "w1.momentum_buffer", "w2.momentum_buffer"]
    assert [v.name for v in step.outputs] == ["l", "w1.1", "w2.1", "w1.momentum_buffer.1",
                                              "w2.momentum_buffer.1"]
    assert [a.name if a is not None else None for a in step.output_aliases] == \
        [None, "w1", "w2", "w1.momentum_buffer", "w2.momentum_buffer"]
    assert "b1.grad" not in {v.name for n in step.nodes for v in n.results}
    for name, shape in (("w1.momentum_buffer", (3, 5)), ("w2.momentum_buffer", (5, 2))):
        np.testing.assert_array_equal(step.weights[name], np.zeros(shape, np.float32))
    check_step_text(step)

    loss, grads = numpy_grads(w0, x)
    feed = {"x": x, **{n: np.asarray(step.weights[n]) for n in step.weights}}
    # A second step from a nonzero buffer exercises the momentum term.
    buf = {p: np.full(w0[p].shape, 0.5, np.float32) for p in ("w1", "w2")}
    feed2 = dict(feed, **{f"{p}.momentum_buffer": buf[p] for p in buf})
    for outs, outs2 in zip(run_both(step, feed), run_both(step, feed2)):
        np.testing.assert_allclose(outs[0], loss, rtol=1e-5)
        for k, p in enumerate(("w1", "w2")):
            # First step: the buffer is zero, so buf = g and p -= lr * g (as torch.optim.SGD).
            np.testing.assert_allclose(outs[1 + k], w0[p] - 0.1 * grads[p], rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(outs[3 + k], grads[p], rtol=1e-4, atol=1e-6)
            b = 0.9 * buf[p] + grads[p]
            np.testing.assert_allclose(outs2[1 + k], w0[p] - 0.1 * b, rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(outs2[3 + k], b, rtol=1e-4, atol=1e-6)
        # b1 is not trained: it is not an output at all.
        assert len(outs) == 5


def test_optimizer_without_grad_pass():
    for passes in ("adamw{lr=0.01}", "sgd"):
        g, _ = mlp()
        with pytest.raises(PartitaError, match=r"no parameter gradients.*run the grad pass before"):
            partita.optimize(g, passes=passes, reproducer_dir=None)


@pytest.mark.parametrize("text", [
    # add(%w, %v) of equal shapes sends one gradient value to both params.
    """graph @m(%x: f32[3], %w: f32[3] param, %v: f32[3] param) -> (f32[]) {
  %y = add(%w, %v) : f32[3]
  %z = mul(%y, %x) : f32[3]
  %l = sum(%z) : f32[]
  return %l
}""",
    # Scalar params whose sum is the loss: both gradients are the seed itself.
    """graph @m(%x: f32[3], %w: f32[] param, %v: f32[] param) -> (f32[]) {
  %y = add(%w, %v) : f32[]
  return %y
}""",
])
def test_every_param_gets_its_own_named_gradient(text):
    g = partita.parse(text)
    for v in g.inputs:
        g.weights[v.name] = np.full(v.type.shape, 2.0, np.float32)
    with_grads = partita.optimize(g.clone(), passes="grad")
    names = [v.name for v in with_grads.outputs]
    assert names[1:] == ["w.grad", "v.grad"]
    step = partita.optimize(g, passes="grad,sgd{lr=0.5}")
    check_step_text(step)
    assert [v.name for v in step.outputs][1:] == ["w.1", "v.1"]
    feed = {n: np.asarray(step.weights[n]) for n in step.weights}
    grads = partita.run(with_grads, feed)[1:]
    np.testing.assert_array_equal(grads[0], grads[1])
    for outs in run_both(step, feed):
        for k in (1, 2):
            np.testing.assert_allclose(outs[k], 2.0 - 0.5 * grads[0], rtol=1e-6)


def test_a_pass_refusing_its_input_writes_no_reproducer(tmp_path):
    # The user's graph is the reproducer of a user error; the file is for compiler bugs.
    from partita.passes.manager import PassManager

    g = partita.parse("""graph @g(%w: f32[3] param) -> (f32[3]) {
  %0 = mul(%w, %w) : f32[3]
  return %0
}
""")
    with pytest.raises(PartitaError, match=r"pass 'grad' failed: AutodiffError: .* must be a scalar") as e:
        PassManager.parse("grad", reproducer_dir=tmp_path).run(g)
    assert "reproducer" not in str(e.value)
    assert list(tmp_path.iterdir()) == []
