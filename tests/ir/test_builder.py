"""The Builder: inferred types, normalized attributes, insertion points, operand errors."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.ir import (Builder, DenseAttr, Graph, GraphEditError, Location, PartitaError, TensorType, TypeRuleError,
                        UnknownOpError, Value, bool_, f16, f32, i32, i64, print_graph, verify)
from partita.ir.diagnostics import AttributeError_

from .test_graph import check


def tt(*shape, dtype=f32) -> TensorType:
    return TensorType(shape, dtype)


def test_types_are_inferred():
    b = Builder()
    x = b.input("x", tt(4, 1))
    y = b.input("y", tt(3, dtype=i64))
    s = b.add(x, y)
    assert s.type == tt(4, 3)                   # broadcast, f32 wins over i64
    c = b.less(x, y)
    assert c.type == tt(4, 3, dtype=bool_)
    d = b.div(y, y)
    assert d.type == tt(3)                      # integer division is true division
    m = b.matmul(b.input("a", tt(2, 5)), b.input("w", tt(5, 7)))
    assert m.type == tt(2, 7)
    r = b.sum(m, axes=[1], keepdim=True)
    assert r.type == tt(2, 1)
    k = b.cast(r, dtype=f16)
    assert k.type == tt(2, 1, dtype=f16)
    lo, hi = b.split(x, axis=0, sizes=[1, 3])
    assert (lo.type, hi.type) == (tt(1, 1), tt(3, 1))
    assert isinstance(b.graph, Graph)
    b.ret(s, c, d, k, hi)
    check(b.graph)


def test_emit_and_named_methods_agree():
    g1, g2 = Graph("g"), Graph("g")
    for g, use_emit in ((g1, True), (g2, False)):
        b = Builder(g)
        x = b.input("x", tt(4))
        if use_emit:
            y = b.emit("gelu", x, approximate="tanh")
            z = b.emit("add", y, x, name="z")
        else:
            y = b.gelu(x, approximate="tanh")
            z = b.add(y, x, name="z")
        b.ret(z)
    assert g1.diff(g2) is None
    assert "%z = add(%0, %x) : f32[4]" in print_graph(g1)


def test_attributes_are_normalized_and_defaults_filled():
    b = Builder()
    x = b.input("x", tt(2, 3))
    s = b.sum(x, axes=[np.int64(1)])
    assert s.producer.attrs == {"axes": (1,), "keepdim": False}
    assert type(s.producer.attrs["axes"][0]) is int
    c = b.cast(x, dtype="i32")
    assert c.producer.attrs["dtype"] is i32 and c.type.dtype is i32
    k = b.constant(value=np.arange(3, dtype=np.int64))
    assert isinstance(k.producer.attrs["value"], DenseAttr) and k.type == tt(3, dtype=i64)
    f = b.full(shape=[2], value=np.float32(1.5))
    assert f.producer.attrs["value"] == 1.5 and type(f.producer.attrs["value"]) is float
    b.ret(s, c, k, f)
    check(b.graph)


def test_locations_default_and_override():
    b = Builder(Graph("g"), loc=Location("model.py", 10))
    x = b.input("x", tt(4))
    y = b.neg(x)
    z = b.relu(y, loc=Location("model.py", 11, 4))
    b.loc = None
    w = b.abs(z)
    b.ret(w)
    assert [n.loc for n in b.graph.nodes] == [Location("model.py", 10), Location("model.py", 11, 4), None]
    assert 'loc("model.py":11:4)' in print_graph(b.graph)


def test_names_only_for_single_results():
    b = Builder()
    x = b.input("x", tt(4))
    lo, hi = b.split(x, axis=0, sizes=[2, 2], name="parts")
    assert lo.name is None and hi.name is None
    y = b.neg(x, name="y")
    assert y.name == "y"


def test_insertion_before_a_node():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", tt(4))
    a = b.neg(x)
    c = b.relu(a)
    b.ret(c)
    b.set_insertion_before(c.producer)
    p = b.abs(a)
    q = b.exp(p)
    assert [n.op for n in g.nodes] == ["neg", "abs", "exp", "relu"]
    b.set_insertion_end()
    r = b.tanh(q)
    assert g.last is r.producer
    check(g)


def test_insertion_after_a_node_chains():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", tt(4))
    a = b.neg(x)
    c = b.relu(a)
    b.ret(c)
    b.set_insertion_after(a.producer)
    p = b.abs(a)
    q = b.exp(p)   # after p, not between a and p
    assert [n.op for n in g.nodes] == ["neg", "abs", "exp", "relu"]
    assert a.producer.is_before(p.producer) and p.producer.is_before(q.producer)
    check(g)


def test_insertion_point_respects_definitions():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", tt(4))
    a = b.neg(x)
    c = b.relu(a)
    b.ret(c)
    b.set_insertion_before(a.producer)
    with pytest.raises(GraphEditError, match=r"abs: operand 0 \(%\?: f32\[4\], a result of relu\) is used before its definition; "
                                             r"insert abs after that relu"):
        b.abs(c)
    assert len(g) == 2  # nothing was added
    check(g)


def test_bad_operands():
    b = Builder(Graph("g"))
    x = b.input("x", tt(4))
    with pytest.raises(PartitaError, match="add: operand 1 is a int, not a Value"):
        b.add(x, 3)
    with pytest.raises(PartitaError, match="neg: operand 0 is a ndarray, not a Value"):
        b.neg(np.zeros(4))
    other = Builder(Graph("other"))
    y = other.input("y", tt(4))
    with pytest.raises(GraphEditError, match=r"add: operand %y: f32\[4\] does not belong to graph @g"):
        b.add(x, y)
    with pytest.raises(TypeRuleError, match=r"add takes 2 operand\(s\) \(lhs, rhs\), got 1"):
        b.add(x)
    with pytest.raises(TypeRuleError, match=r"add: shapes \[4\] and \[3\] do not broadcast"):
        b.add(x, b.input("z", tt(3)))
    with pytest.raises(TypeRuleError, match="add is not defined on bool tensors"):
        flag = b.input("flag", tt(4, dtype=bool_))
        b.add(flag, flag)
    with pytest.raises(TypeRuleError, match="where: the condition must be bool, got f32"):
        b.where(x, x, x)
    assert len(b.graph) == 0


def test_bad_attributes():
    b = Builder()
    x = b.input("x", tt(4, 4))
    with pytest.raises(AttributeError_, match="sum: unknown attribute 'axis' .did you mean 'axes'.."):
        b.sum(x, axis=1)
    with pytest.raises(AttributeError_, match="cast: missing required attribute 'dtype'"):
        b.cast(x)
    with pytest.raises(AttributeError_, match="gelu: attribute 'approximate' must be one of 'none', 'tanh', got 'fast'"):
        b.gelu(x, approximate="fast")
    with pytest.raises(AttributeError_, match="attribute 'keepdim' must be true or false, got 1"):
        b.sum(x, axes=[0], keepdim=1)
    assert len(b.graph) == 0


def test_unknown_ops():
    b = Builder()
    x = b.input("x", tt(4))
    with pytest.raises(UnknownOpError, match="unknown op 'rleu' .did you mean 'relu'.."):
        b.emit("rleu", x)
    with pytest.raises(AttributeError, match="Builder has no method or op named 'rleu'"):
        b.rleu(x)
    with pytest.raises(AttributeError):
        b._private  # noqa: B018  (private names never resolve to ops)
    assert not hasattr(b, "rleu") and hasattr(b, "relu")


def test_built_graph_runs_like_numpy():
    b = Builder(Graph("mlp"))
    x = b.input("x", tt(2, 3))
    w = b.param("w", tt(3, 4))
    s = b.state("s", tt(4))
    y = b.add(b.matmul(x, w), s)
    b.ret(b.relu(y))
    g = b.graph
    assert [v.role for v in g.inputs] == ["input", "param", "state"]
    verify(g)
    rng = np.random.default_rng(0)
    xs, ws, ss = (rng.standard_normal(sh).astype(np.float32) for sh in ((2, 3), (3, 4), (4,)))
    (out,) = partita.run(g, [xs], {"w": ws, "s": ss})
    np.testing.assert_allclose(out, np.maximum(xs @ ws + ss, 0), rtol=1e-6)


def test_values_know_their_builder_graph():
    b = Builder()
    x = b.input("x", tt(4))
    y = b.neg(x)
    assert isinstance(y, Value) and y.graph is b.graph and y.producer.graph is b.graph
