"""Graph edits keep SSA, use lists, output counts and the order numbering exact."""

from __future__ import annotations

import random

import numpy as np
import pytest

import partita
from partita.ir import Builder, Graph, GraphEditError, Node, TensorType, VerifyError, f32, i64, verify
from partita.ir.graph import Value

T = TensorType((4,), f32)


def check(g: Graph) -> None:
    """``verify`` plus an independent recount of every bookkeeping field."""
    verify(g)
    nodes = list(g.nodes)
    assert len(g) == len(nodes)
    assert list(reversed(nodes)) == list(g.reversed_nodes())
    assert g.first is (nodes[0] if nodes else None) and g.last is (nodes[-1] if nodes else None)
    for a, b in zip(nodes, nodes[1:]):
        assert a.next is b and b.prev is a
        assert a.is_before(b) and not b.is_before(a)
    users: dict[Value, dict[Node, int]] = {}
    for n in nodes:
        assert n.graph is g
        for v in n.operands:
            users.setdefault(v, {}).setdefault(n, 0)
            users[v][n] += 1
    outs: dict[Value, int] = {}
    for v in g.outputs:
        outs[v] = outs.get(v, 0) + 1
    for v in g.values():
        assert v.graph is g
        assert v.users == users.get(v, {}), v
        assert v.is_output == (v in outs)
        assert v.num_uses == sum(users.get(v, {}).values()) + outs.get(v, 0)
        assert v.has_uses == (v.num_uses > 0)


def chain(n: int = 3):
    """x -> neg -> neg -> ... (n nodes); returns graph, builder, input and results."""
    g = Graph("chain")
    b = Builder(g)
    x = b.input("x", T)
    vals = []
    v = x
    for _ in range(n):
        v = b.neg(v)
        vals.append(v)
    b.ret(v)
    return g, b, x, vals


def new_node(op: str, *operands: Value, t: TensorType = T) -> Node:
    return Node(op, operands, {}, [t])


# --- appending and inserting ------------------------------------------------------------------

def test_builder_chain_bookkeeping():
    g, b, x, vals = chain(4)
    check(g)
    assert [n.op for n in g.nodes] == ["neg"] * 4
    assert x.users == {vals[0].producer: 1}
    assert g.outputs == [vals[-1]] and vals[-1].is_output


def test_insert_before_after_prepend_keep_counts():
    g, b, x, (a, c, d) = chain(3)
    n1 = g.insert_before(c.producer, new_node("relu", a))
    check(g)
    n2 = g.insert_after(c.producer, new_node("add", c, x))
    check(g)
    n3 = g.prepend(new_node("abs", x))
    check(g)
    assert [n.op for n in g.nodes] == ["abs", "neg", "relu", "neg", "add", "neg"]
    assert a.users == {c.producer: 1, n1: 1}
    assert x.users == {a.producer: 1, n2: 1, n3: 1}
    assert n3.is_before(n1) and n1.is_before(n2)


def test_same_value_twice_counts_twice():
    g, b, x, (a,) = chain(1)
    m = b.mul(a, a)
    b.ret(m)
    check(g)
    assert a.users == {m.producer: 1 + 1}
    g.set_operand(m.producer, 1, x)
    check(g)
    assert a.users == {m.producer: 1} and x.users[m.producer] == 1


def test_append_use_before_definition_is_refused_and_leaves_graph_intact():
    g, b, x, (a, c, d) = chain(3)
    bad = new_node("relu", d)
    with pytest.raises(GraphEditError, match=r"relu: operand 0 \(%\?: f32\[4\], a result of neg\) is used before its definition"):
        g.insert_before(c.producer, bad)
    assert bad.graph is None and len(g) == 3 and bad not in d.users
    check(g)
    with pytest.raises(GraphEditError, match="used before its definition"):
        g.prepend(new_node("abs", a))
    check(g)
    # The refused node can still be inserted where it is valid.
    g.append(bad)
    check(g)


def test_double_insertion_refused():
    g, b, x, (a,) = chain(1)
    n = g.append(new_node("relu", a))
    with pytest.raises(GraphEditError, match="relu is already in graph @chain"):
        g.append(n)
    other = Graph("other")
    with pytest.raises(GraphEditError, match="already in graph @chain"):
        other.append(n)
    check(g)


def test_foreign_values_refused_everywhere():
    g, b, x, (a,) = chain(1)
    h, hb, y, (c,) = chain(1)
    h.name = "other"
    with pytest.raises(GraphEditError, match=r"operand %.* does not belong to graph @chain"):
        g.append(new_node("relu", c))
    with pytest.raises(GraphEditError, match="does not belong to graph @chain"):
        g.set_outputs([c])
    with pytest.raises(GraphEditError, match="does not belong to graph @chain"):
        g.set_operand(a.producer, 0, y)
    with pytest.raises(GraphEditError, match="does not belong to graph @chain"):
        g.replace_all_uses(a, c)
    with pytest.raises(GraphEditError, match="is not a node of graph @chain"):
        g.erase(c.producer)
    with pytest.raises(GraphEditError, match="is not a node of graph @chain"):
        g.insert_before(c.producer, new_node("relu", x))
    check(g)
    check(h)


def test_node_results_cannot_feed_the_node_itself_before_insertion():
    g, b, x, _ = chain(1)
    n = Node("neg", [x], {}, [T])
    n.operands[0] = n.results[0]  # a hand-made self loop
    with pytest.raises(GraphEditError, match="does not belong"):
        g.append(n)
    check(g)


# --- erasing ---------------------------------------------------------------------------------

def test_erase_used_node_refused_with_users_named():
    g, b, x, (a, c, d) = chain(3)
    with pytest.raises(GraphEditError, match=r"cannot erase neg: its result .* is still used by neg"):
        g.erase(a.producer)
    with pytest.raises(GraphEditError, match="still used by the graph outputs"):
        g.erase(d.producer)
    check(g)


def test_erase_drops_uses_and_detaches():
    g, b, x, (a, c, d) = chain(3)
    extra = b.relu(a)
    check(g)
    n = extra.producer
    g.erase(n)
    check(g)
    assert n.graph is None and extra.graph is None and n.prev is None and n.next is None
    assert a.users == {c.producer: 1}
    with pytest.raises(GraphEditError, match="not a node of graph"):
        g.erase(n)
    with pytest.raises(GraphEditError, match="does not belong"):
        g.append(new_node("neg", extra))
    # An erased node can be inserted again (its operands are still in the graph).
    g.append(n)
    check(g)


def test_erase_all_in_reverse_like_dce():
    g, b, x, vals = chain(5)
    g.set_outputs([])
    for n in g.reversed_nodes():
        g.erase(n)
        check(g)
    assert len(g) == 0 and g.first is None and g.last is None and not x.users


# --- replacing and rewiring --------------------------------------------------------------------

def test_replace_all_uses_moves_users_and_outputs():
    g, b, x, (a, c, d) = chain(3)
    e = b.relu(a)
    b.ret(d, a, a)
    check(g)
    g.replace_all_uses(a, x)
    check(g)
    assert not a.has_uses
    assert g.outputs == [d, x, x]
    assert x.users == {a.producer: 1, c.producer: 1, e.producer: 1}
    g.erase(a.producer)
    check(g)


def test_replace_with_different_type_refused():
    g, b, x, (a,) = chain(1)
    y = b.input("y", TensorType((4,), i64))
    with pytest.raises(GraphEditError, match=r"types differ \(f32\[4\] vs i64\[4\]\)"):
        g.replace_all_uses(a, y)
    check(g)


def test_replace_with_later_value_refused_atomically():
    g, b, x, (a, c, d) = chain(3)
    early = b.set_insertion_after(a.producer).relu(a)   # right after a: fine for c, d
    b.set_insertion_end()
    late = b.relu(d)
    # Users of x: a's node only; users of a: c's node and early's node.
    with pytest.raises(GraphEditError, match="not before its new user"):
        g.replace_all_uses(a, late)
    # Nothing moved: every user still reads a.
    assert a.users == {c.producer: 1, early.producer: 1} and not late.users
    check(g)


def test_set_operand_checks():
    g, b, x, (a, c, d) = chain(3)
    with pytest.raises(GraphEditError, match="would be used before its definition"):
        g.set_operand(a.producer, 0, d)
    with pytest.raises(GraphEditError, match="would be used before its definition"):
        g.set_operand(a.producer, 0, a)  # its own result
    with pytest.raises(GraphEditError, match="operand index 3 is out of range"):
        g.set_operand(c.producer, 3, x)
    check(g)
    g.set_operand(d.producer, 0, x)
    check(g)
    assert not c.has_uses and x.users == {a.producer: 1, d.producer: 1}


def test_set_outputs_counts():
    g, b, x, (a, c) = chain(2)
    g.set_outputs([a, a, x])
    check(g)
    assert a.num_uses == 1 + 2
    g.set_outputs([])
    check(g)
    assert not a.is_output and not x.is_output


def test_move_before():
    g, b, x, (a, c, d) = chain(3)
    r = b.relu(x)
    g.move_before(a.producer, r.producer)
    check(g)
    assert g.first is r.producer
    g.move_before(r.producer, r.producer)  # onto itself: nothing changes
    check(g)
    other, *_ = chain(1)
    with pytest.raises(GraphEditError, match="not a node of graph"):
        g.move_before(other.first, r.producer)
    # Moving a node above its operand's definition is the caller's bug; verify names it.
    g.move_before(a.producer, d.producer)
    with pytest.raises(VerifyError, match=r"operand 0 \(%\S+\) is a value defined later \(use before definition\)"):
        verify(g)


# --- inputs, results -------------------------------------------------------------------------

def test_input_roles_and_lookup():
    g = Graph("g")
    g.add_input("x", T)
    w = g.add_input("w", T, "param")
    with pytest.raises(GraphEditError, match="input role must be one of input, param, state, got 'weight'"):
        g.add_input("v", T, "weight")
    assert g.input("w") is w and g.params() == [w]
    with pytest.raises(KeyError):
        g.input("nope")


def test_result_of_multi_result_node():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((4, 6), f32))
    lo, hi = b.split(x, axis=1, sizes=[2, 4])
    b.ret(hi)
    check(g)
    with pytest.raises(GraphEditError, match="split has 2 results; use .results"):
        _ = lo.producer.result
    assert lo.producer is hi.producer and (lo.index, hi.index) == (0, 1)


def test_duplicate_input_names_caught_by_verify():
    g = Graph("g")
    g.add_input("x", T)
    g.add_input("x", T)
    with pytest.raises(VerifyError, match="two inputs are named %x"):
        verify(g)


# --- stale bookkeeping is caught --------------------------------------------------------------

def test_verify_catches_stale_use_lists_and_output_counts():
    g, b, x, (a, c) = chain(2)
    a.users[c.producer] += 1
    with pytest.raises(VerifyError, match=r"operand %\S+ has a stale use list \(it records 2 use\(s\) by this node, the node has 1\)"):
        verify(g)
    a.users[c.producer] -= 1
    ghost = Node("neg", [a], {}, [T])
    a.users[ghost] = 1
    with pytest.raises(VerifyError, match="use list of %.* is stale"):
        verify(g)
    del a.users[ghost]
    c._out_uses += 1
    with pytest.raises(VerifyError, match=r"output count of %\S+ is stale \(records 2, the graph outputs it 1 time\(s\)\)"):
        verify(g)
    c._out_uses -= 1
    check(g)


# --- ordering ----------------------------------------------------------------------------------

def test_order_numbers_under_many_insertions_at_one_spot(monkeypatch):
    g, b, x, (a, c) = chain(2)
    full = []
    monkeypatch.setattr(Graph, "renumber", lambda self: full.append(1))
    inserted = []
    for k in range(3000):
        where = k % 3
        n = new_node("relu", x)
        if where == 0:
            g.insert_before(c.producer, n)       # always just before c
        elif where == 1:
            g.insert_after(a.producer, n)        # always just after a
        else:
            g.prepend(n)                         # always at the head
        inserted.append(n)
    monkeypatch.undo()
    # Relabelling stayed local: the whole graph was never renumbered.
    assert not full
    nodes = list(g.nodes)
    orders = [n._order for n in nodes]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    rng = random.Random(0)
    for _ in range(2000):
        i, j = rng.randrange(len(nodes)), rng.randrange(len(nodes))
        assert nodes[i].is_before(nodes[j]) == (i < j)
    check(g)
    # Inserting before c many times keeps them in insertion order, just before c.
    before_c = [n for n in inserted[0::3]]
    k = nodes.index(c.producer)
    assert nodes[k - len(before_c):k] == before_c


def test_random_insertions_keep_a_total_order():
    rng = random.Random(1)
    g, b, x, _ = chain(1)
    for _ in range(2000):
        nodes = list(g.nodes)
        anchor = nodes[min(len(nodes) - 1, int(rng.expovariate(0.5)))]
        n = new_node("relu", x)
        (g.insert_before if rng.random() < 0.5 else g.insert_after)(anchor, n)
    check(g)


def test_renumber_restores_even_gaps():
    g, b, x, (a, c) = chain(2)
    for _ in range(100):
        g.insert_before(c.producer, new_node("relu", x))
    g.renumber()
    orders = [n._order for n in g.nodes]
    gaps = {q - p for p, q in zip(orders, orders[1:])}
    assert len(gaps) == 1 and gaps.pop() > 1000
    check(g)


def test_topo_sort_repairs_order_and_is_stable():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", T)
    a = b.neg(x)        # 0
    p = b.relu(x)       # 1  independent of a
    c = b.neg(a)        # 2
    q = b.abs(x)        # 3  independent
    d = b.add(c, p)     # 4
    b.ret(d, q)
    before = list(g.nodes)
    g.topo_sort()
    assert list(g.nodes) == before  # already sorted: unchanged
    check(g)
    # Break the order; topo_sort fixes it and keeps independent nodes where they were.
    g.move_before(a.producer, c.producer)   # c above its operand a
    g.move_before(a.producer, d.producer)   # d above everything
    with pytest.raises(VerifyError):
        verify(g)
    assert list(g.nodes) == [c.producer, d.producer, a.producer, p.producer, q.producer]
    g.topo_sort()
    check(g)
    # Among the nodes that are ready, the one that came first goes first.
    assert list(g.nodes) == [a.producer, c.producer, p.producer, d.producer, q.producer]
    assert len(g) == 5


def test_topo_sort_names_the_cycle():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", T)
    a = b.neg(x, name="a")
    c = b.relu(a, name="c")
    d = b.abs(c, name="d")
    e = b.neg(x, name="e")
    b.ret(d, e)
    # A buggy pass wires a's operand to d: a -> c -> d -> a, bypassing the checks.
    na = a.producer
    x.users.pop(na)
    na.operands[0] = d
    d.users[na] = 1
    with pytest.raises(GraphEditError) as ei:
        g.topo_sort()
    msg = str(ei.value)
    assert "cycle (3 node(s) cannot be ordered)" in msg
    assert "%a = neg -> %c = relu -> %d = abs -> %a = neg" in msg
    assert "%e" not in msg
    with pytest.raises(VerifyError, match=r"node %a = neg .*operand 0 \(%d\) is a value defined later"):
        verify(g)


# --- iteration while editing -------------------------------------------------------------------

def test_iteration_survives_erasing_the_current_node():
    g, b, x, vals = chain(6)
    g.set_outputs([x])
    seen = []
    for n in g.reversed_nodes():
        seen.append(n)
        g.erase(n)
    assert seen == [v.producer for v in reversed(vals)] and len(g) == 0


def test_iteration_survives_erasing_nodes_ahead():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", T)
    vals = [b.neg(x) for _ in range(8)]
    b.ret(vals[0])
    seen = []
    for n in g.nodes:
        seen.append(n)
        # Erase the next two nodes, if unused.
        for _ in range(2):
            nxt = n.next
            if nxt is not None:
                g.erase(nxt)
        check(g)
    assert seen == [vals[0].producer, vals[3].producer, vals[6].producer]
    assert list(g.nodes) == seen


def test_iteration_after_erasing_current_and_next():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", T)
    vals = [b.neg(x) for _ in range(6)]
    b.ret(x)
    seen = []
    for n in g.nodes:
        seen.append(n)
        nxt = n.next
        g.erase(n)
        if nxt is not None:
            g.erase(nxt)
    assert seen == [vals[0].producer, vals[2].producer, vals[4].producer]
    assert len(g) == 0


def test_iteration_skips_nodes_inserted_after_current():
    g, b, x, vals = chain(3)
    seen = []
    for n in g.nodes:
        seen.append(n.op)
        if n.op == "neg":
            g.insert_after(n, new_node("relu", n.results[0]))
    assert seen == ["neg"] * 3
    assert [n.op for n in g.nodes] == ["neg", "relu"] * 3
    check(g)


# --- clone and diff ----------------------------------------------------------------------------

def test_clone_is_equal_and_independent():
    text = """graph @g(%x: f32[4,6], %w: f32[4,6] param) -> (f32[4,2], f32[4,6]) {
  %lo, %hi = split(%x) {axis=1, sizes=[2, 4]} : f32[4,2], f32[4,4]
  %s = add(%x, %w) : f32[4,6] loc("model.py":12:5)
  return %lo, %s
}
"""
    g = partita.parse(text, "g.pir")
    g.weights["w"] = np.ones((4, 6), np.float32)
    h = g.clone()
    assert g.diff(h) is None and g.structurally_equal(h)
    check(h)
    assert [n.text_loc for n in h.nodes] == [n.text_loc for n in g.nodes]
    assert dict(h.weights) == dict(g.weights) and h.weights is not g.weights
    h.weights["extra"] = np.zeros(2, np.float32)
    assert "extra" not in g.weights
    # Editing the clone leaves the original alone.
    s = h.last.results[0]
    r = h.append(Node("relu", [s], {}, [s.type]))
    h.set_outputs([h.outputs[0], r.results[0]])
    check(h)
    check(g)
    assert len(g) == 2 and len(h) == 3
    assert g.diff(h) == "node counts differ: 2 vs 3"


def graph_from(text: str):
    return partita.parse(text, "d.pir")


BASE = """graph @g(%x: f32[4], %y: f32[4] param) -> (f32[4]) {
  %a = add(%x, %y) : f32[4]
  %b = gelu(%a) {approximate="tanh"} : f32[4]
  return %b
}
"""


@pytest.mark.parametrize("change,expect", [
    (("@g(", "@h("), "names differ: g vs h"),
    (("%y: f32[4] param", "%y: f32[4]"), "input differs"),
    (("add(%x, %y)", "add(%y, %x)"), "node 0 (add) operands differ"),
    (("add(%x, %y)", "sub(%x, %y)"), "node 0 differs"),
    (('approximate="tanh"', 'approximate="none"'), "node 1 differs"),
    (("%b", "%c"), "result names differ: b vs c"),
    (("return %b", "return %a"), "outputs differ"),
    (('"tanh"} : f32[4]', '"tanh"} : f32[4] loc("m.py":3)'), "node 1 differs"),
])
def test_diff_finds_each_kind_of_difference(change, expect):
    g = graph_from(BASE)
    other = BASE.replace(*change)
    assert other != BASE
    h = graph_from(other)
    d = g.diff(h)
    assert d is not None and expect in d, d
    assert h.diff(g) is not None


def test_diff_attribute_values_by_type_and_nan():
    g = graph_from(BASE)
    h = g.clone()
    assert g.diff(h) is None
    n = h.first.next
    n.attrs = {"approximate": "tanh"}
    assert g.diff(h) is None
    f = Graph("f")
    b = Builder(f)
    x = b.input("x", TensorType((2,), f32))
    b.ret(b.emit("pad", x, pads=[1, 1], value=float("nan")))
    assert f.diff(f.clone()) is None               # NaN equals NaN here
    f2 = f.clone()
    f2.first.attrs = dict(f2.first.attrs, value=1)
    f3 = f.clone()
    f3.first.attrs = dict(f3.first.attrs, value=1.0)
    assert f2.diff(f3) is not None                 # 1 and 1.0 are different attributes
    f4 = f.clone()
    f4.first.attrs = dict(f4.first.attrs, value=True)
    assert f2.diff(f4) is not None                 # and so are 1 and true


def test_diff_numbered_names_are_anonymous():
    g = graph_from(BASE.replace("%a", "%7"))
    h = graph_from(BASE.replace("%a", "%0"))
    assert g.diff(h) is None
    b = Builder(Graph("g"))
    x = b.input("x", TensorType((4,), f32))
    y = b.param("y", TensorType((4,), f32))
    b.ret(b.gelu(b.add(x, y), approximate="tanh", name="b"))
    assert graph_from(BASE.replace("%a", "%0")).diff(b.graph) is None
