"""The memory analysis of training graphs and the ``recompute`` rewrite.

``analyze`` is checked on graphs small enough to count by hand: the saved activations are the
forward values that backward nodes read, and the peak follows the liveness rule of
``memory.py`` (an input lives until its last use, a result from its node to its last use, an
output to the end). ``recompute`` must keep the meaning of the graph (the reference
interpreter gives identical outputs), never keep more bytes for backward, and keep fewer
when a cheap op's operands are kept anyway.
"""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.autodiff.recompute import analyze, backward_start, recompute

# A forward pass that reads %y twice (in tanh and in the product), with its backward written
# out by hand: the backward reads %x, %y and %h. The seed's name opens the backward section.
HAND = """
graph @t(%x: f32[2,3], %w: f32[3,4] param) -> (f32[], f32[3,4]) {
  %y = matmul(%x, %w) : f32[2,4] loc("model.py":1)
  %h = tanh(%y) : f32[2,4] loc("model.py":2)
  %z = mul(%h, %y) : f32[2,4] loc("model.py":3)
  %l = sum(%z) : f32[] loc("model.py":4)
  %grad.seed = full() {shape=[], value=1.0} : f32[] loc("model.py":4)
  %dz = broadcast_to(%grad.seed) {shape=[2, 4]} : f32[2,4] loc("model.py":4)
  %dh = mul(%dz, %y) : f32[2,4] loc("model.py":3)
  %dy1 = mul(%dz, %h) : f32[2,4] loc("model.py":3)
  %dy2 = tanh_grad(%dh, %h) : f32[2,4] loc("model.py":2)
  %dy = add(%dy1, %dy2) : f32[2,4] loc("model.py":2)
  %xt = transpose(%x) {perm=[1, 0]} : f32[3,2] loc("model.py":1)
  %w.grad = matmul(%xt, %dy) : f32[3,4] loc("model.py":1)
  return %l, %w.grad
}"""

FORWARD = """
graph @mlp(%x: f32[4,3], %w1: f32[3,6] param, %b1: f32[6] param, %w2: f32[6,2] param) -> (f32[]) {
  %0 = matmul(%x, %w1) : f32[4,6] loc("model.py":10)
  %1 = add(%0, %b1) : f32[4,6] loc("model.py":11)
  %h = tanh(%1) : f32[4,6] loc("model.py":12)
  %g = gelu(%h) : f32[4,6] loc("model.py":13)
  %s = exp(%h) : f32[4,6] loc("model.py":14)
  %m = mul(%g, %s) : f32[4,6] loc("model.py":15)
  %3 = matmul(%m, %w2) : f32[4,2] loc("model.py":16)
  %4 = mul(%3, %3) : f32[4,2] loc("model.py":17)
  %l = mean(%4) : f32[] loc("model.py":18)
  return %l
}"""


def hand():
    return partita.parse(HAND, "t.pir")


def grad_graph():
    g = partita.parse(FORWARD, "mlp.pir")
    return partita.optimize(g, passes="grad")


def train_step():
    g = partita.parse(FORWARD, "mlp.pir")
    rng = np.random.default_rng(1)
    for v in g.inputs:
        if v.role == "param":
            g.weights[v.name] = (0.5 * rng.standard_normal(v.type.shape)).astype(np.float32)
    return partita.training_step(g, loss=0, optimizer="sgd", lr=0.1)


def feed_for(g, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {v.name: (0.5 * rng.standard_normal(v.type.shape)).astype(v.type.dtype.np) for v in g.inputs}


def saved_by_definition(g) -> list[tuple[str, int]]:
    """(name, bytes) of the node results before the seed that some node after it reads; an
    unnamed value goes by its type, as in the report."""
    nodes = list(g.nodes)
    k = nodes.index(backward_start(g))
    forward, backward = nodes[:k], set(nodes[k:])
    return [(f"%{r.name}" if not r.name.isdigit() else str(r.type),
             int(np.prod(r.type.shape)) * r.type.dtype.itemsize)
            for n in forward for r in n.results if any(u in backward for u in r.users)]


def test_saved_values_of_the_hand_written_graph():
    rep = analyze(hand())
    # %x is read by backward too, but it is an input: the caller holds it, it is not saved.
    assert sorted(name for name, _, _ in rep.saved) == ["%h", "%y"]
    assert dict((name, b) for name, b, _ in rep.saved) == {"%y": 32, "%h": 32}
    assert rep.saved_bytes == 64
    where = {name: at for name, _, at in rep.saved}
    assert where == {"%y": "matmul at model.py:1", "%h": "tanh at model.py:2"}
    assert rep.input_bytes == 24 + 48
    assert "kept for backward: 2 values, 64 B" in rep.text()


@pytest.mark.parametrize("make", [grad_graph, train_step], ids=["grad", "train_step"])
def test_saved_values_are_what_backward_reads(make):
    g = make()
    rep = analyze(g)
    assert [(name, b) for name, b, _ in rep.saved] == saved_by_definition(g)
    assert rep.saved_bytes == sum(b for _, b, _ in rep.saved) > 0
    # The seed's name survives the text form, and with it the analysis.
    back = partita.parse(partita.print_graph(g), "step.pir")
    assert analyze(back).saved == rep.saved


def test_peak_bytes_by_hand():
    g = partita.parse("""
graph @p(%x: f32[4], %w: f32[2,1] param) -> (f32[], f32[2,4]) {
  %a = mul(%x, %w) : f32[2,4] loc("model.py":1)
  %b = tanh(%a) : f32[2,4] loc("model.py":2)
  %c = add(%b, %x) : f32[2,4] loc("model.py":3)
  %l = sum(%c) : f32[] loc("model.py":4)
  return %l, %b
}""", "p.pir")
    rep = analyze(g)
    # node 0: x 16 + w 8 + a 32                  = 56
    # node 1: x 16 + a 32 + b 32 (w is dead)     = 80
    # node 2: x 16 + b 32 + c 32 (a is dead)     = 80
    # node 3: b 32 (an output) + c 32 + l 4      = 68
    assert rep.peak_bytes == 80
    assert rep.peak_at == "tanh at model.py:2 (node 1)"
    assert rep.input_bytes == 24
    assert rep.saved == [] and rep.saved_bytes == 0


def test_recompute_lowers_saved_bytes_and_keeps_the_outputs():
    g = hand()
    feed = feed_for(g)
    before = [np.asarray(o) for o in partita.run(g, feed)]
    assert recompute(g) == 1
    partita.verify(g)
    # tanh(%y) is computed again in backward, since %y is kept for it anyway; the matmul is
    # not cheap, so %y stays saved.
    rep = analyze(g)
    assert [name for name, _, _ in rep.saved] == ["%y"]
    assert rep.saved_bytes == 32
    bwd = list(g.nodes)[list(g.nodes).index(backward_start(g)):]
    clones = [n for n in bwd if n.op == "tanh"]
    assert len(clones) == 1 and clones[0].operands[0].name == "y"
    assert str(clones[0].loc) == "model.py:2"
    after = [np.asarray(o) for o in partita.run(g, feed)]
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("make", [grad_graph, train_step], ids=["grad", "train_step"])
def test_recompute_keeps_meaning_and_never_saves_more(make):
    g = make()
    feed = feed_for(g, seed=3)
    before = [np.asarray(o) for o in partita.run(g, feed)]
    saved = analyze(g).saved_bytes
    n = recompute(g)
    partita.verify(g)
    assert analyze(g).saved_bytes <= saved
    if n:
        assert analyze(g).saved_bytes < saved
    after = [np.asarray(o) for o in partita.run(g, feed)]
    assert len(before) == len(after)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    # Once done, there is nothing left to recompute.
    assert recompute(g) == 0


def test_recompute_without_backward_section_is_a_no_op():
    g = partita.parse(FORWARD, "mlp.pir")
    before = g.clone()
    assert backward_start(g) is None
    assert recompute(g) == 0
    assert g.diff(before) is None
    assert partita.optimize(g, passes="recompute").diff(before) is None


def test_recompute_pass_by_name():
    g = hand()
    feed = feed_for(g)
    want = [np.asarray(o) for o in partita.run(g, feed)]
    by_function = hand()
    recompute(by_function)
    by_pass = partita.optimize(hand(), passes="recompute")
    assert by_pass.diff(by_function) is None
    assert analyze(by_pass).saved_bytes == 32
    got = [np.asarray(o) for o in partita.run(by_pass, feed)]
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)


def test_recompute_is_deterministic():
    # Several fresh copies (different object ids) must come out as the same text.
    texts = set()
    for _ in range(4):
        g = grad_graph()
        recompute(g)
        texts.add(partita.print_graph(g))
    assert len(texts) == 1


def test_recompute_on_a_cleaned_up_training_step_terminates_and_keeps_the_step():
    # A training step runs cse, which may merge the gradient seed into an equal forward
    # constant: the backward section then starts right after the loss, and a value recomputed
    # just before that first backward node must count as backward (it once looped forever).
    text = """graph @m(%x: f32[4,3], %w: f32[3,3] param, %t: f32[4,3]) -> (f32[]) {
  %0 = matmul(%x, %w) : f32[4,3]
  %1 = tanh(%0) : f32[4,3]
  %2 = sub(%1, %t) : f32[4,3]
  %3 = mul(%2, %2) : f32[4,3]
  %4 = mean(%3) : f32[]
  return %4
}
"""
    fwd = partita.parse(text)
    fwd.weights["w"] = np.full((3, 3), 0.1, np.float32)
    step = partita.training_step(fwd, optimizer="sgd", lr=0.1)

    assert backward_start(step) is not None
    before = analyze(step)
    feed = {"x": np.ones((4, 3), np.float32), "t": np.zeros((4, 3), np.float32)}
    want = partita.run(step, feed)
    recompute(step)
    partita.verify(step)
    assert analyze(step).saved_bytes <= before.saved_bytes
    for a, b in zip(partita.run(step, feed), want):
        np.testing.assert_array_equal(a, b)
