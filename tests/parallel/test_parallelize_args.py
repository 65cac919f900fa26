"""``parallelize``'s arguments and the strategy registry.

Arguments of the wrong kind (a strategy that is not text, a mesh of None or an int,
annotations as a list of pairs, a placement of None, an int or a list) are PartitaErrors that
name the argument, what was given and what is accepted, never a TypeError or AttributeError
from inside. A strategy defined outside partita/parallel/strategies/ (here, in this module)
registers under its word and combines with the built-in ones.
"""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.ir.builder import Builder
from partita.ir.dtypes import f32
from partita.ir.graph import Graph
from partita.ir.types import TensorType
from partita.parallel import Mesh, Placement
from partita.parallel.strategies import (AnnotationContext, Strategy, StrategyError, parse_strategy, register,
                                         registered, unregister)
from partita.parallel.strategy import parallelize
from partita.passes.manager import Pass


def _step() -> Graph:
    """An SGD step of a two-layer tanh MLP: x [8, 6] -> [8, 4], the loss a sum of squares."""
    g = Graph("mlp")
    b = Builder(g)
    x = g.add_input("x", TensorType((8, 6), f32), "input")
    w1 = g.add_input("w1", TensorType((6, 8), f32), "param")
    w2 = g.add_input("w2", TensorType((8, 4), f32), "param")
    y = b.matmul(b.tanh(b.matmul(x, w1)), w2)
    g.set_outputs([b.sum(b.mul(y, y))])
    step = partita.training_step(g, loss=0, optimizer="sgd", lr=0.1)
    rng = np.random.default_rng(0)
    step.weights.update({"w1": rng.standard_normal((6, 8)).astype(np.float32),
                         "w2": rng.standard_normal((8, 4)).astype(np.float32)})
    return step


@pytest.fixture(scope="module")
def step() -> Graph:
    return _step()


def _feed() -> dict:
    return {"x": np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32)}


# --- arguments of the wrong kind (B14) ----------------------------------------------------------------


@pytest.mark.parametrize("strategy, parts", [
    (5, ["strategy must be text", "got 5 (int)", "registered: pp, dp, zero1, zero2, zero3, megatron, sp"]),
    (["dp", "megatron"], ["strategy must be text", "(list)", "write 'dp+megatron'"]),
    (True, ["strategy must be text", "got True (bool)"]),
])
def test_a_strategy_that_is_not_text(step, strategy, parts):
    with pytest.raises(StrategyError) as e:
        parallelize(step, "dp=2", strategy)
    for p in parts:
        assert p in str(e.value), str(e.value)


@pytest.mark.parametrize("mesh, parts", [
    (None, ["mesh must be a Mesh, its text such as 'dp=2,tp=2'", "got None (NoneType)"]),
    (4, ["mesh must be a Mesh", "got 4 (int)", "write mesh='dp=4'"]),
    (2.0, ["mesh must be a Mesh", "got 2.0 (float)"]),
    ([1, 2], ["mesh must be a Mesh", "(name, size) pairs", "got [1, 2] (list)"]),
    ([("dp", "2")], ["bad mesh", "positive integer size"]),
])
def test_a_mesh_of_the_wrong_kind(step, mesh, parts):
    with pytest.raises(StrategyError) as e:
        parallelize(step, mesh, "dp")
    for p in parts:
        assert p in str(e.value), str(e.value)


def test_a_mesh_as_a_dict_or_pairs_still_works(step):
    for mesh in ({"dp": 2}, [("dp", 2)], Mesh.of("dp=2"), "dp:2"):
        assert str(parallelize(step, mesh, "dp").mesh) == "mesh(dp=2)"


@pytest.mark.parametrize("annotations, parts", [
    ([("x", "[dp, -]")], ["annotations must be a mapping from value name to placement", "got [('x', '[dp, -]')] "
                          "(list)", "pass dict(pairs)"]),
    (5, ["annotations must be a mapping", "got 5 (int)"]),
    ("x=[dp, -]", ["annotations must be a mapping", "(str)"]),
    ({5: "[dp, -]"}, ["annotations are keyed by value name", "got the key 5 (int)"]),
    ({"x": None}, ["annotation on %x: the placement must be text such as '[dp, -]' or 'replicated'",
                   "got None (NoneType)"]),
    ({"x": 3}, ["annotation on %x: the placement must be text", "got 3 (int)"]),
    ({"x": ["dp", "-"]}, ["annotation on %x: the placement must be text", "(list)",
                          "write it as the text '[dp, -]'"]),
])
def test_annotations_of_the_wrong_kind(step, annotations, parts):
    with pytest.raises(StrategyError) as e:
        parallelize(step, "dp=2", None, annotations)
    for p in parts:
        assert p in str(e.value), str(e.value)


def test_annotations_as_text_or_placement_still_work(step):
    for ann in ({"x": "[dp, -]"}, {"%x": Placement.split(2, {0: "dp"})}):
        prog = parallelize(step, "dp=2", None, ann)
        assert next(v for v in prog.local.inputs if v.name == "x").type.shape == (4, 6)


def test_a_graph_that_is_not_a_graph():
    with pytest.raises(StrategyError, match=r"graph must be a partita Graph .*got 'model.pir' \(str\)"):
        parallelize("model.pir", "dp=2", "dp")


def test_an_unknown_strategy_word_lists_the_registered_ones(step):
    with pytest.raises(StrategyError) as e:
        parallelize(step, "dp=2", "dp+zero4")
    msg = str(e.value)
    assert "unknown strategy 'zero4' (did you mean 'zero3'?)" in msg, msg
    assert "combine pp, dp, zero1, zero2, zero3, megatron, sp, ep with '+'" in msg, msg


# --- a strategy from another module ---------------------------------------------------------------------


class _SeenBy(Pass):
    """Records the param shapes of the program it runs on (the per-rank one, for a strategy pass)."""

    name = "record-shapes"

    def __init__(self, seen: list) -> None:
        super().__init__()
        self.seen = seen

    def run(self, graph: Graph) -> Graph:
        self.seen.append({v.name: v.type.shape for v in graph.inputs if v.role == "param"})
        return graph


class RowSplit(Strategy):
    """Splits every 2-D param by rows over its axis where the axis divides them."""

    name = "rowsplit"
    aliases = ("rows",)
    axis = "mp"
    order = 5
    seen: list = []

    def annotate(self, ctx: AnnotationContext) -> None:
        axis = ctx.axis(self)
        n = ctx.mesh.axis_size(axis)
        for v in ctx.graph.inputs:
            if v.role == "param" and v.type.rank == 2 and v.type.shape[0] % n == 0:
                ctx.place(v, Placement.split(2, {0: axis}))
                ctx.notes.append(f"%{ctx.name(v)} split by rows over '{axis}'")

    def passes(self, ctx: AnnotationContext):
        return [_SeenBy(self.seen)]


@pytest.fixture
def rowsplit():
    register(RowSplit)
    RowSplit.seen.clear()
    try:
        yield RowSplit
    finally:
        unregister("rowsplit")


def test_a_strategy_registered_from_another_module_is_used_by_its_word(step, rowsplit):
    assert registered()[-1] == "rowsplit"
    feed = _feed()
    want = partita.run(step, feed, step.weights)
    for mesh, text, named in (("dp=2,mp=2", "dp+rowsplit", "dp+rowsplit"), ("mp=2", "rows", "rowsplit"),
                              ("dp=2,mp=2", "rowsplit+zero2", "zero2+rowsplit")):
        prog = parallelize(step, mesh, text)
        partita.verify(prog.local)
        assert str(prog.strategy) == named
        assert "%w1 split by rows over 'mp'" in prog.plan.notes
        local = {v.name: v.type.shape for v in prog.local.inputs}
        assert local["w1"] == (3, 8) and local["w2"] == (4, 4)
        # Its pass ran on the per-rank program, and the plan timed it.
        assert RowSplit.seen[-1]["w1"] == (3, 8) and "record-shapes" in prog.plan.timings
        got = prog.simulate(feed, step.weights)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The unknown-word message lists it while it is registered.
    with pytest.raises(StrategyError, match=r"combine pp, dp, zero1, zero2, zero3, megatron, sp, ep, rowsplit with"):
        parallelize(step, "mp=2", "rowsplt+dp+zz")


def test_a_registered_strategy_is_checked_like_the_built_in_ones(step, rowsplit):
    m = Mesh.of("dp=2")
    with pytest.raises(StrategyError, match="puts dp and rowsplit on the same mesh axis 'dp'; use a 2-D mesh such "
                                            "as 'dp=2,mp=2'"):
        parse_strategy("dp+rowsplit", m)
    with pytest.raises(StrategyError, match="rowsplit needs a mesh axis named 'mp' on the mesh mesh"):
        parse_strategy("rowsplit", Mesh.of("a=2,b=2"))
    s = parse_strategy("rowsplit+dp", Mesh.of("dp=2,mp=2"))
    assert s.names == ("dp", "rowsplit") and s.axis_of("rowsplit") == "mp"
    assert [x.name for x in s.annotation_order()] == ["rowsplit", "dp"]


def test_registering_a_taken_or_bad_word_is_refused():
    class Other(RowSplit):
        name = "dp"

    with pytest.raises(StrategyError, match="the strategy word 'dp' is taken by partita.parallel.strategies.dp"):
        register(Other)
    for word in ("a+b", "", "none", "two words"):
        bad = type("Bad", (RowSplit,), {"name": word, "aliases": ()})
        with pytest.raises(StrategyError, match="must be non-empty text without"):
            register(bad)
    with pytest.raises(StrategyError, match="is not a partita.parallel.strategies.Strategy"):
        register(object())
    assert "dp" in registered() and "a+b" not in registered()


def test_unregister_removes_the_word_and_its_aliases(step):
    register(RowSplit)
    unregister("rowsplit")
    for word in ("rowsplit", "rows"):
        with pytest.raises(StrategyError, match=f"unknown strategy '{word}'"):
            parallelize(step, "mp=2", word)
    with pytest.raises(StrategyError, match="no strategy is registered as 'rowsplit'"):
        unregister("rowsplit")


# --- pipeline arguments (issue 35): checked before the schedule or the stages are built -----------

@pytest.fixture(scope="module")
def gpt_step():
    g = partita.models.gpt(layers=2, hidden=32, heads=4, seq=8, vocab=64, batch=8, dtype="f32")
    return partita.training_step(g, loss="cross_entropy", optimizer="sgd")


@pytest.mark.parametrize("mesh,kw,message", [
    ("pp=2", {"microbatches": 10 ** 8}, r"microbatches=100,000,000 does not divide the batch: %ids i64\[8,8\]"),
    ("pp=2", {"schedule": "interleaved", "virtual_stages": 10 ** 6, "microbatches": 2},
     r"2000000 chunk\(s\) asked for \(2 pp ranks x virtual_stages=1000000\), but @gpt.train_step has 2"),
    ("pp=1000000", {}, r"1000000 chunk\(s\) asked for"),
    ("pp=99999999999999999999", {}, r"more than the 16,777,216 partita plans for"),
    ("pp=2", {"unroll": "no"}, r"unroll must be True or False, got 'no' \(str\)"),
    ("dp=2", {"unroll": "no"}, r"unroll must be True or False, got 'no' \(str\)"),
    ("pp=2", {"stages": {"h.1": 1}}, r"stages must be a list of layer names .* got dict"),
    ("pp=2", {"stages": [1, "h.1"]}, r"stages must be a list of layer names"),
])
def test_pipeline_arguments_fail_fast_and_clearly(gpt_step, mesh, kw, message):
    import time

    strategy = "pp" if mesh.startswith("pp") else "dp"
    t0 = time.perf_counter()
    with pytest.raises(partita.PartitaError, match=message):
        parallelize(gpt_step, mesh, strategy, **kw)
    # Each was a MemoryError after a minute, 36 s, or a hang: a bound against that, not a timing.
    assert time.perf_counter() - t0 < 10
