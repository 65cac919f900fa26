"""Meshes and placements in the IR: the text form, clone/diff, and the verifier."""

from __future__ import annotations

import numpy as np
import pytest

from partita.ir import Builder, Graph, TensorType, VerifyError, f32, parse, print_graph, verify
from partita.ir import parser as parser_mod
from partita.parallel import Mesh, Placement

from .test_errors import parse_error
from .test_text import DESIGN_MLP, fixed_point, roundtrip

# The global-view example of DESIGN.md, with its elisions ("...") written out: the other
# inputs of the single-device example, the output type, and the add and relu between.
DESIGN_GLOBAL = """\
graph @mlp(%x: f32[32@dp,784], %w1: f32[784,256@tp] param, %b1: f32[256@tp] param,
           %w2: f32[256@tp,10] param) -> (f32[32@dp,10] partial(tp)) mesh(dp=2, tp=2) {
  %0 = matmul(%x, %w1) : f32[32@dp,256@tp]
  %1 = add(%0, %b1) : f32[32@dp,256@tp]
  %2 = relu(%1) : f32[32@dp,256@tp]
  %3 = matmul(%2, %w2) : f32[32@dp,10] partial(tp)
  return %3
}
"""

# The same graph in the printer's layout (the header is too long for one line).
GLOBAL_PRINTED = """\
graph @mlp(
    %x: f32[32@dp,784],
    %w1: f32[784,256@tp] param,
    %b1: f32[256@tp] param,
    %w2: f32[256@tp,10] param
) -> (f32[32@dp,10] partial(tp)) mesh(dp=2, tp=2) {
  %0 = matmul(%x, %w1) : f32[32@dp,256@tp]
  %1 = add(%0, %b1) : f32[32@dp,256@tp]
  %2 = relu(%1) : f32[32@dp,256@tp]
  %3 = matmul(%2, %w2) : f32[32@dp,10] partial(tp)
  return %3
}
"""

DP, TP = ("dp",), ("tp",)


def test_design_global_view_example():
    g, printed = roundtrip(DESIGN_GLOBAL, "mlp.pir")
    assert printed == GLOBAL_PRINTED
    fixed_point(GLOBAL_PRINTED)
    assert g.mesh == Mesh.of("dp=2,tp=2")
    assert [v.placement for v in g.inputs] == [
        Placement((DP, ())), Placement(((), TP)), Placement((TP,)), Placement((TP, ()))]
    results = [n.result for n in g.nodes]
    assert [r.placement for r in results[:3]] == [Placement((DP, TP))] * 3
    assert results[3].placement == Placement((DP, ()), TP)
    assert g.outputs[0].placement.partial == TP
    # The DESIGN.md node lines print exactly as written there.
    body = GLOBAL_PRINTED.splitlines()
    assert "  %0 = matmul(%x, %w1) : f32[32@dp,256@tp]" in body
    assert "  %3 = matmul(%2, %w2) : f32[32@dp,10] partial(tp)" in body
    # Placements are metadata of the global view: the graph still computes the same thing.
    from partita import run

    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in g.inputs}
    plain = parse(DESIGN_MLP)
    got = run(g, feeds)
    want = run(plain, feeds)
    np.testing.assert_allclose(np.asarray(got[0] if isinstance(got, (list, tuple)) else got),
                               np.asarray(want[0] if isinstance(want, (list, tuple)) else want), rtol=1e-5)


def test_design_global_view_with_its_all_reduce():
    # DESIGN.md's last line in this repository's attribute spelling: attribute strings are
    # quoted, the collective records take the group size, and op=sum is the default.
    text = GLOBAL_PRINTED.replace(") -> (f32[32@dp,10] partial(tp))", ") -> (f32[32@dp,10])").replace(
        "  return %3\n",
        '  %4 = all_reduce(%3) {axis="tp", group_size=2} : f32[32@dp,10]\n  return %4\n')
    g = fixed_point(text)
    last = list(g.nodes)[-1]
    assert last.op == "all_reduce" and last.attrs["op"] == "sum"
    assert last.operands[0].placement == Placement((DP, ()), TP)
    assert last.result.placement == Placement((DP, ()))


def test_graph_without_placements_prints_as_before():
    g = parse(DESIGN_MLP)
    assert g.mesh is None and all(v.placement is None for v in g.values())
    assert "@" not in print_graph(g).split("(", 1)[1] and "mesh" not in print_graph(g)


def test_mesh_without_placements_and_every_type_position(attr_ops):
    text = """\
graph @g(%x: f32[8@a@b,6] state, %y: f32[] partial(b, a)) -> (f32[8@a@b,6] aliases(%x), f32[] partial(a, b)) mesh(a=2, b=2, c=1) {
  %s, %t = split(%x) {axis=1, sizes=[3, 3]} : f32[8@a@b,3], f32[8@a@b,3] partial(c)
  %v = neg(%x) : f32[8@a@b,6]
  %u = add(%y, %y) : f32[] partial(a, b)
  return %v, %u
}
"""
    g, printed = roundtrip(text)
    # partial axes are a set, printed sorted.
    assert "partial(a, b)" in printed and "partial(b, a)" not in printed
    assert printed.splitlines()[3].endswith(" mesh(a=2, b=2, c=1) {")
    assert g.inputs[0].placement == Placement((("a", "b"), ()))
    assert g.inputs[1].placement == Placement((), ("a", "b"))
    s, t = next(iter(g.nodes)).results
    assert s.placement == Placement((("a", "b"), ())) and t.placement == Placement((("a", "b"), ()), ("c",))
    fixed_point(printed)
    # A mesh alone, with no placed value, round-trips too.
    g2, p2 = roundtrip("graph @h(%x: f32[4]) -> (f32[4]) mesh(dp=4) {\n  %0 = neg(%x) : f32[4]\n  return %0\n}\n")
    assert g2.mesh == Mesh.of("dp=4") and p2.splitlines()[0] == "graph @h(%x: f32[4]) -> (f32[4]) mesh(dp=4) {"


def test_placed_lines_take_the_general_path():
    g = parse(DESIGN_GLOBAL)
    p = parser_mod._Parser(DESIGN_GLOBAL, "t.pir")
    p.values = {v.name: v for v in g.inputs}
    start = DESIGN_GLOBAL.index("  %0 =")
    assert p.fast_nodes(Graph("x"), start) == start  # '@' keeps the fast regex from matching
    plain = DESIGN_MLP.replace(": f32[32,256]\n  %1", ": f32[32,256] partial(tp)\n  %1")
    p = parser_mod._Parser(plain, "t.pir")
    p.values = {v.name: v for v in parse(DESIGN_MLP).inputs}
    start = plain.index("  %0 =")
    assert p.fast_nodes(Graph("x"), start) == start
    # A partial(...) continuing a plain node line on the next line belongs to that node.
    broken = DESIGN_GLOBAL.replace("f32[32@dp,10] partial(tp)\n  return", "f32[32@dp,10]\n      partial(tp)\n  return")
    assert list(parse(broken).nodes)[-1].result.placement == Placement((DP, ()), TP)
    split = GLOBAL_PRINTED.replace(": f32[32@dp,256@tp]\n  %1", ": f32[32@dp,256@tp]\n    // a comment\n    partial(dp)\n  %1")
    parse_error(split, 9, "dp)", "the partial sum of %0 uses mesh axis 'dp' a second time (already used by dim 0)")


GP = GLOBAL_PRINTED


_BAD_PLACEMENTS = [  # (text, line, the text the caret is under, its occurrence in the line, message)
    (GP.replace("%w1: f32[784,256@tp]", "%w1: f32[784,256@tq]"), 3, "@tq", 0,
     "dim 1 of %w1 uses mesh axis 'tq', which mesh(dp=2, tp=2) does not have; its axes are dp, tp"),
    (GP.replace("%x: f32[32@dp,784]", "%x: f32[32@dp,784@dp]"), 2, "@dp", 1,
     "dim 1 of %x uses mesh axis 'dp' a second time (already used by dim 0)"),
    (GP.replace("%1 = add(%0, %b1) : f32[32@dp,256@tp]", "%1 = add(%0, %b1) : f32[32@dp@dp,256@tp]"), 8, "@dp", 1,
     "dim 0 of %1 uses mesh axis 'dp' a second time (already used by the same dim)"),
    (GP.replace("%0 = matmul(%x, %w1) : f32[32@dp,256@tp]", "%0 = matmul(%x, %w1) : f32[32@dp,256@tp@dp]"), 7,
     "@dp", 1, "dim 1 of %0 uses mesh axis 'dp' a second time (already used by dim 0)"),
    (GP.replace(" mesh(dp=2, tp=2)", ""), 2, "@dp", 0,
     "%x has a placement, but the graph has no mesh; declare one after the output types"),
    (GP.replace("mesh(dp=2, tp=2)", "mesh(dp=2, tp=3)"), 3, "256", 0,
     "dim 1 of %w1 (size 256) does not divide over tp=3; pad the dimension to a multiple of 3 or choose another split"),
    (GP.replace("mesh(dp=2, tp=2)", "mesh(dp=3, tp=2)"), 2, "32", 1,
     "dim 0 of %x (size 32) does not divide over dp=3"),
    (GP.replace(": f32[32@dp,10] partial(tp)\n", ": f32[32@dp,10] partial(tp, dp)\n"), 10, "dp)", 0,
     "the partial sum of %3 uses mesh axis 'dp' a second time (already used by dim 0)"),
    (GP.replace(": f32[32@dp,10] partial(tp)\n", ": f32[32@dp,10] partial(pt)\n"), 10, "pt", 0,
     "the partial sum of %3 uses mesh axis 'pt', which mesh(dp=2, tp=2) does not have"),
    (GP.replace(": f32[32@dp,10] partial(tp)\n", ": f32[32@dp,10] partial()\n"), 10, ")", 1,
     "expected a mesh axis name in partial(...), like partial(tp), found ')'"),
    (GP.replace(": f32[32@dp,10] partial(tp)\n", ": f32[32@dp,10] partial(tp dp)\n"), 10, "dp)", 0,
     "expected ',' or ')' in partial(...), found 'dp'"),
    (GP.replace(": f32[32@dp,10] partial(tp)\n", ": f32[32@dp,10] partial tp\n"), 10, "tp", 0,
     "expected '(' and the mesh axes of the partial sum"),
    (GP.replace("%x: f32[32@dp,784]", "%x: f32[32@d.p,784]"), 2, "@d.p", 0, "expected a mesh axis name after '@'"),
    (GP.replace("mesh(dp=2, tp=2)", "mesh(dp=2, dp=2)"), 6, "dp", 2, "mesh axis 'dp' appears twice in the mesh"),
    (GP.replace("mesh(dp=2, tp=2)", "mesh(dp=0, tp=2)"), 6, "0", 1,
     "expected the size of mesh axis 'dp' (a positive integer), found '0'"),
    (GP.replace("mesh(dp=2, tp=2)", "mesh()"), 6, ")", 3, "expected a mesh axis like dp=2, found ')'"),
    (GP.replace("mesh(dp=2, tp=2)", "mesh(dp 2)"), 6, "2", 2, "'=' and the size of mesh axis 'dp'"),
    (GP.replace(") -> (f32[32@dp,10] partial(tp))", ") -> (f32[32@dp,10])"), 6, "f32[32@dp,10]", 0,
     "output %3 has placement [dp, -] partial(tp) but the graph signature declares [dp, -]"),
]


@pytest.mark.parametrize("text, line, at, nth, message", _BAD_PLACEMENTS)
def test_placement_parse_errors(text, line, at, nth, message):
    parse_error(text, line, at, message, nth=nth)


def test_dense_types_take_no_placement(attr_ops):
    text = ('graph @g() -> (f32[2]) mesh(dp=2) {\n'
            '  %c = constant() {value=dense<f32[2@dp], [1.0, 2.0]>} : f32[2]\n  return %c\n}\n')
    parse_error(text, 2, "@dp", "the type of a dense attribute cannot carry a placement")


# --- graphs built in code: clone, diff, the verifier ---------------------------------------

def _placed_graph() -> Graph:
    g = Graph("p")
    g.mesh = Mesh.of("dp=2, tp=2")
    b = Builder(g)
    x = b.input("x", TensorType((4, 6), f32))
    x.placement = Placement((DP, ()))
    y = b.relu(x)
    y.placement = Placement((DP, ()))
    z = b.neg(y)
    g.set_outputs([z])
    return g


def test_clone_and_diff_carry_mesh_and_placements():
    g = _placed_graph()
    verify(g)
    c = g.clone()
    assert c.mesh == g.mesh and c.inputs[0].placement == Placement((DP, ()))
    assert [r.placement for n in c.nodes for r in n.results] == [Placement((DP, ())), None]
    assert g.diff(c) is None and c.diff(g) is None
    c.mesh = Mesh.of("dp=2, tp=1")
    assert g.diff(c) == "meshes differ: mesh(dp=2, tp=2) vs mesh(dp=2, tp=1)"
    c = g.clone()
    c.inputs[0].placement = None
    assert "input %x: f32[4,6] placements differ: [dp, -] vs None" == g.diff(c)
    c = g.clone()
    list(c.nodes)[1].result.placement = Placement(((), ()), TP)
    assert g.diff(c) == "node 1 (neg) result 0 placements differ: None vs [-, -] partial(tp)"
    # And through the text form.
    g2 = parse(print_graph(g))
    assert g.diff(g2) is None


def test_verifier_accepts_and_rejects_placements():
    g = _placed_graph()
    verify(g)
    g.inputs[0].placement = Placement((("pp",), ()))
    with pytest.raises(VerifyError) as e:
        verify(g)
    assert str(e.value) == ("@p: input %x has an invalid placement: dim 0 of %x uses mesh axis 'pp', which "
                            "mesh(dp=2, tp=2) does not have; its axes are dp, tp")
    g.inputs[0].placement = Placement((DP, DP))
    with pytest.raises(VerifyError, match="dim 1 of %x uses mesh axis 'dp' a second time"):
        verify(g)
    g.inputs[0].placement = Placement((DP,))
    with pytest.raises(VerifyError, match=r"the placement of %x has 1 dim\(s\) but the tensor has rank 2"):
        verify(g)
    g.inputs[0].placement = None
    relu = next(iter(g.nodes))
    relu.result.placement = Placement(((), TP + DP))
    with pytest.raises(VerifyError) as e:
        verify(g)
    msg = str(e.value)
    assert msg.startswith("error: node %0 = relu has an invalid placement: dim 1 of %0 (size 6) does not "
                          "divide over tp=2 x dp=2 (4 pieces); pad the dimension to a multiple of 4")
    assert "> |   %0 = relu(%x) : f32[4,6@tp@dp]" in msg  # the IR around it shows the placement
    relu.result.placement = Placement((DP, ()))
    g.mesh = None
    with pytest.raises(VerifyError) as e:
        verify(g)
    assert "node %0 = relu has an invalid placement: %0 is placed [dp, -] but @p has no mesh" in str(e.value)
    relu.result.placement = None
    verify(g)  # no placement, no mesh: a plain graph again
    # The verifier does not check placements against the ops (the sharding rules will).
    g.mesh = Mesh.of("dp=2")
    relu.result.placement = Placement(((), ()), DP)
    verify(g)
