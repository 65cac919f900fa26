"""The text form: print -> parse -> print is the identity, and parsing loses nothing."""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import partita
from partita.ir import Builder, DenseAttr, Graph, Location, TensorType, bf16, f32, i64, parse, print_graph, verify
from partita.ir import parser as parser_mod
from partita.ir import printer as printer_mod

from .conftest import ATTR_OP, MULTI_OP

try:  # random valid graphs shared with the pass tests
    from strategies import graphs as shared_graphs
except ImportError:  # pragma: no cover - the shared module is part of the tree
    shared_graphs = None


def roundtrip(text: str, filename: str = "t.pir"):
    """Parse, verify, print, parse again: the two prints agree and the graphs are equal."""
    g = parse(text, filename)
    verify(g)
    t1 = print_graph(g)
    g2 = parse(t1, "printed.pir")
    verify(g2)
    t2 = print_graph(g2)
    assert t1 == t2
    assert g.diff(g2) is None, g.diff(g2)
    assert g2.diff(g) is None
    return g, t1


def fixed_point(text: str):
    """Text already in printed form prints back exactly."""
    g, t1 = roundtrip(text)
    assert t1 == text, f"printed:\n{t1}\nexpected:\n{text}"
    return g


DESIGN_MLP = """\
graph @mlp(%x: f32[32,784], %w1: f32[784,256] param, %b1: f32[256] param,
           %w2: f32[256,10] param) -> (f32[32,10]) {
  %0 = matmul(%x, %w1) : f32[32,256]
  %1 = add(%0, %b1) : f32[32,256]
  %2 = relu(%1) : f32[32,256]
  %3 = matmul(%2, %w2) : f32[32,10]
  return %3
}
"""


def test_design_mlp_example_exactly_as_written():
    g, printed = roundtrip(DESIGN_MLP, "mlp.pir")
    assert [v.name for v in g.inputs] == ["x", "w1", "b1", "w2"]
    assert [v.role for v in g.inputs] == ["input", "param", "param", "param"]
    assert [n.op for n in g.nodes] == ["matmul", "add", "relu", "matmul"]
    assert [n.text_loc for n in g.nodes] == [Location("mlp.pir", 3 + i, 8) for i in range(4)]
    assert g.loc == Location("mlp.pir", 1, 1)
    # The header is longer than a line, so the printer wraps it, one input per line.
    assert printed.splitlines()[:6] == [
        "graph @mlp(",
        "    %x: f32[32,784],",
        "    %w1: f32[784,256] param,",
        "    %b1: f32[256] param,",
        "    %w2: f32[256,10] param",
        ") -> (f32[32,10]) {",
    ]
    # And it computes what it says.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 784)).astype(np.float32)
    w = {"w1": rng.standard_normal((784, 256)).astype(np.float32) * 0.05,
         "b1": rng.standard_normal(256).astype(np.float32),
         "w2": rng.standard_normal((256, 10)).astype(np.float32) * 0.05}
    (out,) = partita.run(g, [x], w)
    want = np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


BRIEF_EXAMPLE = """\
graph @mlp(%x: f32[32,784], %w1: f32[784,256] param) -> (f32[32,1]) {
  %0 = matmul(%x, %w1) : f32[32,256]
  %1 = sum(%0) {axes=[1], keepdim=true} : f32[32,1]
  %2, %3 = split(%0) {axis=1, sizes=[128, 128]} : f32[32,128], f32[32,128]
  %c = constant() {value=dense<f32[2], [1.0, 2.0]>} : f32[2]
  return %1
}
"""


def test_brief_example_with_multi_result_and_constant():
    g = fixed_point(BRIEF_EXAMPLE)
    split = [n for n in g.nodes if n.op == "split"][0]
    assert [r.name for r in split.results] == ["2", "3"]
    assert split.attrs["sizes"] == (128, 128)
    c = g.last
    assert isinstance(c.attrs["value"], DenseAttr)
    np.testing.assert_array_equal(c.attrs["value"].array, np.array([1.0, 2.0], np.float32))


def test_default_attributes_are_not_printed():
    text = BRIEF_EXAMPLE.replace("{axes=[1], keepdim=true}", "{axes=[1], keepdim=false}").replace(
        ": f32[32,1]", ": f32[32]").replace("-> (f32[32,1])", "-> (f32[32])")
    g, printed = roundtrip(text)
    assert "%1 = sum(%0) {axes=[1]} : f32[32]" in printed
    assert g.first.next.attrs == {"axes": (1,), "keepdim": False}


# --- every attribute kind ------------------------------------------------------------------------

ALL_KINDS = r"""graph @attrs(%x: f32[4]) -> (f32[4], f32[]) {
  %a = ir_test.attrs(%x) {i=-3, f=1e-05, b=true, s="q\"uote\\ back\nline \u00e9 tab\t{}", dt=bf16, ints=[-1, 0, 2], fs=[inf, -inf, nan, -2.5, 1e+20, 0.0], sc=-7, t=dense<f32[2,2], [[1.0, -2.0], [3.5, 0.0]]>, mode="b"} : f32[4]
  %b = ir_test.attrs() {f=-inf, sc=2.5} : f32[]
  %c = ir_test.attrs(%a) {f=nan, ints=[], fs=[], sc=false} : f32[4]
  %d = ir_test.attrs(%c) {i=123456789012345678901234567890, f=-0.0} : f32[4]
  return %d, %b
}
"""


def test_every_attribute_kind_round_trips(attr_ops):
    g = fixed_point(ALL_KINDS)
    a, b, c, d = list(g.nodes)
    A = a.attrs
    assert A["i"] == -3 and type(A["i"]) is int
    assert A["f"] == 1e-5 and type(A["f"]) is float
    assert A["b"] is True
    assert A["s"] == 'q"uote\\ back\nline \u00e9 tab\t{}'
    assert A["dt"] is bf16
    assert A["ints"] == (-1, 0, 2)
    fs = A["fs"]
    assert fs[0] == math.inf and fs[1] == -math.inf and math.isnan(fs[2]) and fs[3:] == (-2.5, 1e20, 0.0)
    assert A["sc"] == -7 and type(A["sc"]) is int
    np.testing.assert_array_equal(A["t"].array, np.array([[1, -2], [3.5, 0]], np.float32))
    assert A["mode"] == "b"
    assert b.attrs["f"] == -math.inf and b.attrs["sc"] == 2.5 and not b.operands
    assert math.isnan(c.attrs["f"]) and c.attrs["b"] is False and c.attrs["sc"] is False
    assert c.attrs["ints"] == () and c.attrs["fs"] == ()
    assert d.attrs["i"] == 123456789012345678901234567890
    assert math.copysign(1, d.attrs["f"]) == -1 and d.attrs["s"] == ""
    # Defaults (b=false, s="") are not printed, but -0.0 is not the default 0.0.
    assert "b=false" not in ALL_KINDS and "f=-0.0" in ALL_KINDS


@pytest.mark.parametrize("written,value", [
    ("1e-5", 1e-5), ("1E3", 1000.0), (".5", 0.5), ("-.5", -0.5), ("1.", 1.0), ("-0.0", -0.0),
    ("2.5e+3", 2500.0), ("-1e-300", -1e-300), ("1e999", math.inf), ("7", 7.0), ("-7", -7.0),
])
def test_float_spellings(attr_ops, written, value):
    text = f"graph @g() -> (f32[]) {{\n  %a = ir_test.attrs() {{f={written}}} : f32[]\n  return %a\n}}\n"
    g, printed = roundtrip(text)
    got = g.first.attrs["f"]
    assert type(got) is float and got == value and math.copysign(1, got) == math.copysign(1, value)
    assert parse(printed).first.attrs["f"] == value


DENSE_CASES = [
    ("f32[2,3]", "[[1.0, -2.5, 1e-05], [inf, -inf, nan]]"),
    ("f64[3]", "[0.1, -1e+300, 5e-324]"),
    ("f16[3]", "[0.5, 65504.0, -0.0009765625]"),
    ("bf16[3]", "[1.0, 3.140625, -256.0]"),
    ("i64[2,2]", "[[-9223372036854775808, 0], [1, 9223372036854775807]]"),
    ("bool[3]", "[true, false, true]"),
    ("u8[2]", "[0, 255]"),
    ("i8[2]", "[-128, 127]"),
    ("i32[1]", "[-2147483648]"),
    ("f32[2,3]", "0.5"),
    ("f64[2]", "-inf"),
    ("bf16[4]", "-1.5"),
    ("f16[2,2]", "nan"),
    ("bool[4]", "true"),
    ("i64[3]", "-1"),
    ("f32[0]", "[]"),
    ("f32[0,3]", "[]"),
    ("f32[2,0]", "[[], []]"),
    ("bool[0]", "[]"),
    ("i64[0,0]", "[]"),
    ("f32[]", "2.5"),
    ("f64[]", "-0.0"),
    ("bf16[]", "0.5"),
    ("f16[]", "inf"),
    ("i64[]", "-3"),
    ("bool[]", "false"),
    ("f32[1]", "[7.0]"),
    ("f32[2,1,2]", "[[[1.0, 2.0]], [[3.0, 4.0]]]"),
]


@pytest.mark.parametrize("ty,body", DENSE_CASES, ids=[f"{t}={b}"[:40] for t, b in DENSE_CASES])
def test_dense_round_trips(ty, body):
    text = f"graph @c() -> ({ty}) {{\n  %a = constant() {{value=dense<{ty}, {body}>}} : {ty}\n  return %a\n}}\n"
    g = fixed_point(text)
    arr = g.first.attrs["value"].array
    t = g.first.results[0].type
    assert arr.shape == t.shape and arr.dtype == t.dtype.np
    # The payload reads back bit for bit (NaN and -0.0 included), through the reference run too.
    (out,) = partita.run(g)
    assert out.tobytes() == arr.tobytes()


def test_dense_values_survive_exactly():
    rng = np.random.default_rng(3)
    cases = [rng.standard_normal((3, 4)).astype(np.float32),
             rng.standard_normal(5).astype(np.float64) * 1e10,
             rng.standard_normal(6).astype(np.float16),
             rng.standard_normal((2, 3)).astype(ml_dtypes.bfloat16),
             rng.integers(-2**62, 2**62, (4,), dtype=np.int64),
             rng.integers(0, 2, (3, 3)).astype(bool),
             np.array([np.finfo(np.float32).tiny, np.finfo(np.float32).max, -np.finfo(np.float32).eps], np.float32),
             np.array([np.finfo(np.float16).smallest_subnormal, 65504.0], np.float16)]
    g = Graph("consts")
    b = Builder(g)
    outs = [b.constant(value=a) for a in cases]
    b.ret(*outs)
    g2, printed = roundtrip(print_graph(g))
    for n, a in zip(g2.nodes, cases):
        got = n.attrs["value"].array
        assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes()


# --- structure --------------------------------------------------------------------------------

def test_multi_result_nodes(attr_ops):
    text = f"""graph @m(%x: f32[4,6]) -> (f32[4,4], f32[4,6], f32[4,6]) {{
  %lo, %hi = split(%x) {{axis=1, sizes=[2, 4]}} : f32[4,2], f32[4,4]
  %p, %q, %r = {MULTI_OP}(%x) {{n=3}} : f32[4,6], f32[4,6], f32[4,6]
  %0, %1 = {MULTI_OP}(%p) : f32[4,6], f32[4,6]
  %s = add(%q, %1) : f32[4,6]
  return %hi, %s, %r
}}
"""
    g = fixed_point(text)
    split, fork3, fork2, add = list(g.nodes)
    assert [r.index for r in fork3.results] == [0, 1, 2]
    assert [r.producer for r in fork3.results] == [fork3] * 3
    assert add.operands == [fork3.results[1], fork2.results[1]]


def test_locations():
    text = r"""graph @g(%x: f32[4]) -> (f32[4]) {
  %a = neg(%x) : f32[4] loc("model.py":12:5)
  %b = relu(%a) : f32[4] loc("model.py":13)
  %c = abs(%b) : f32[4] loc("dir/we \"ird\" na\\me.py":3:1)
  %d = neg(%c) : f32[4] loc("<stdin>":0)
  return %d
}
"""
    g = fixed_point(text)
    assert [n.loc for n in g.nodes] == [Location("model.py", 12, 5), Location("model.py", 13),
                                       Location('dir/we "ird" na\\me.py', 3, 1), Location("<stdin>", 0)]
    assert [n.text_loc.line for n in g.nodes] == [2, 3, 4, 5]


def test_comments_are_ignored():
    commented = """// a file comment
// another
graph @g(%x: f32[4], // the input
         %w: f32[4] param) -> (f32[4]) {  // header
  // a full-line comment
  %0 = add(%x, %w) : f32[4]  // trailing comment
  %1 = neg(%0) : f32[4] // no space // twice
      // indented comment

  return %1  // done
}  // closing
// after the graph
"""
    plain = """graph @g(%x: f32[4], %w: f32[4] param) -> (f32[4]) {
  %0 = add(%x, %w) : f32[4]
  %1 = neg(%0) : f32[4]
  return %1
}
"""
    g, printed = roundtrip(commented)
    assert printed == plain
    assert g.diff(parse(plain)) is None
    assert [n.text_loc.line for n in g.nodes] == [6, 7]


def test_scalars_and_size_zero_dims():
    text = """graph @s(%s: f32[], %z: f32[0,3], %e: i64[2,0,5]) -> (f32[], f32[3], f32[0,3], i64[2,0,5]) {
  %0 = add(%s, %s) : f32[]
  %1 = sum(%z) {axes=[0]} : f32[3]
  %2 = mul(%z, %s) : f32[0,3]
  %3 = neg(%e) : i64[2,0,5]
  return %0, %1, %2, %3
}
"""
    g = fixed_point(text)
    assert g.inputs[0].type == TensorType((), f32)
    assert g.inputs[2].type == TensorType((2, 0, 5), i64) and g.inputs[2].type.numel == 0
    outs = partita.run(g, [np.float32(2), np.zeros((0, 3), np.float32), np.zeros((2, 0, 5), np.int64)])
    assert outs[0] == 4 and outs[1].tolist() == [0, 0, 0] and outs[2].shape == (0, 3)


def test_named_and_numbered_values():
    text = """graph @n(%x: f32[4], %w.1: f32[4] state, %3: f32[4]) -> (f32[4], f32[4]) {
  %7 = add(%x, %w.1) : f32[4]
  %w.2 = neg(%7) : f32[4]
  %a_b.c = add(%w.2, %3) : f32[4]
  %0 = relu(%a_b.c) : f32[4]
  return %w.2, %0
}
"""
    g, printed = roundtrip(text)
    # Names are kept; numbered results are renumbered in order, skipping numbered inputs.
    assert "%w.2 = neg(%0) : f32[4]" in printed
    assert "%a_b.c = add(%w.2, %3) : f32[4]" in printed
    assert "%1 = relu(%a_b.c) : f32[4]" in printed
    assert "%0 = add(%x, %w.1) : f32[4]" in printed
    assert [v.role for v in g.inputs] == ["input", "state", "input"]


def test_graphs_without_inputs_or_outputs():
    fixed_point("""graph @c() -> (f32[2]) {
  %0 = constant() {value=dense<f32[2], [1.0, 2.0]>} : f32[2]
  return %0
}
""")
    g = fixed_point("graph @empty() -> () {\n  return\n}\n")
    assert len(g) == 0 and not g.inputs and not g.outputs
    g = fixed_point("graph @sink(%x: f32[4]) -> () {\n  %0 = neg(%x) : f32[4]\n  return\n}\n")
    assert len(g) == 1
    g = fixed_point("graph @id(%x: f32[4]) -> (f32[4], f32[4]) {\n  return %x, %x\n}\n")
    assert g.outputs == [g.inputs[0]] * 2


def test_layout_variations_parse_to_the_same_graph():
    compact = "graph @g(%x:f32[4],%w:f32[4] param)->(f32[4]){%0=add(%x,%w):f32[4] %1=gelu(%0){approximate=\"tanh\"}:f32[4] return %1}"
    spread = """
graph   @g (
   %x : f32 [ 4 ] ,
   %w : f32 [ 4 ]   param
) -> ( f32[4] )
{
      %0   =   add ( %x , %w )   :   f32[4]
  %1 = gelu(%0)
       { approximate = "tanh" }
       : f32[4]
  return   %1
}

"""
    a, ta = roundtrip(compact)
    b, tb = roundtrip(spread)
    assert ta == tb and a.diff(b) is None


def test_builder_names_that_need_sanitizing():
    g = Graph("weird name")  # printed as given; kept simple: names are not validated here
    g.name = "w"
    b = Builder(g)
    x = b.input("my input", TensorType((2,), f32))
    y = b.input("x", TensorType((2,), f32))
    z = b.input("x", TensorType((2,), f32))     # a duplicate: renamed when printed
    r = b.add(x, y, name="x")                   # collides with an input: numbered
    s = b.add(r, z, name="9lives")              # not a valid name: numbered
    t = b.neg(s, name="fine.name")
    b.ret(t)
    printed = print_graph(g)
    assert printed.splitlines()[0] == "graph @w(%my_input: f32[2], %x: f32[2], %x_1: f32[2]) -> (f32[2]) {"
    g2, again = roundtrip(printed)
    assert again == printed
    assert "%fine.name = neg(%1) : f32[2]" in printed


def test_parse_file_and_save_load(tmp_path):
    g = parse(DESIGN_MLP, "mlp.pir")
    rng = np.random.default_rng(0)
    for v in g.params():
        g.weights[v.name] = rng.standard_normal(v.type.shape).astype(np.float32)
    partita.save(g, tmp_path / "mlp.pir")
    assert (tmp_path / "mlp.safetensors").exists()
    h = partita.load(tmp_path / "mlp.pir")
    assert g.diff(h) is None
    assert h.first.text_loc.file == str(tmp_path / "mlp.pir")
    for k in g.weights:
        np.testing.assert_array_equal(h.weights[k], g.weights[k])
    x = rng.standard_normal((32, 784)).astype(np.float32)
    np.testing.assert_array_equal(partita.run(g, [x])[0], partita.run(h, [x])[0])


# --- random graphs ------------------------------------------------------------------------------

NAMES = st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9_.]{0,6}", fullmatch=True), st.sampled_from(["0", "12"]))


@st.composite
def annotated_graphs(draw):
    """Small graphs with what the shared strategy lacks: names, locations, multi-result ops."""
    g = Graph(draw(st.from_regex(r"[a-z][a-z0-9_.]{0,5}", fullmatch=True)))
    b = Builder(g)
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
    t = TensorType(shape, f32)
    pool = [b.input(draw(st.from_regex(r"[a-z][a-z0-9_]{0,4}", fullmatch=True)) + f"_{i}", t,
                    draw(st.sampled_from(["input", "param", "state"])))
            for i in range(draw(st.integers(0, 3)))]
    if not pool:
        pool.append(b.full(shape=list(shape), value=draw(st.sampled_from([0, 1.5, -2, True]))))
        pool[-1] = b.cast(pool[-1], dtype=f32) if pool[-1].type.dtype is not f32 else pool[-1]
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "fork", "attrs"]))
        loc = draw(st.one_of(st.none(), st.builds(Location, st.sampled_from(["m.py", 'a "q".py', ""]),
                                                  st.integers(0, 99), st.integers(0, 9))))
        name = draw(NAMES)
        pick = lambda: pool[draw(st.integers(0, len(pool) - 1))]  # noqa: E731
        if kind == "unary":
            out = b.emit(draw(st.sampled_from(["neg", "relu", "exp", "tanh"])), pick(), loc=loc, name=name)
        elif kind == "binary":
            out = b.emit(draw(st.sampled_from(["add", "mul", "maximum"])), pick(), pick(), loc=loc, name=name)
        elif kind == "fork":
            outs = b.emit(MULTI_OP, pick(), n=draw(st.integers(2, 3)), loc=loc)
            out = outs[draw(st.integers(0, len(outs) - 1))]
        else:
            out = b.emit(ATTR_OP, pick(), loc=loc, name=name,
                         f=draw(st.floats(allow_nan=True, allow_infinity=True)),
                         s=draw(st.text(max_size=6)),
                         fs=draw(st.lists(st.floats(width=32), max_size=3)),
                         sc=draw(st.one_of(st.integers(-2**70, 2**70), st.booleans(), st.floats())),
                         ints=draw(st.lists(st.integers(-5, 5), max_size=3)))
        pool.append(out)
    b.ret(*draw(st.lists(st.sampled_from(pool), max_size=3)))
    return g


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_annotated_graphs_round_trip(attr_ops, data):
    g = data.draw(annotated_graphs())
    verify(g)
    printed = print_graph(g)
    g2, again = roundtrip(printed)
    assert again == printed
    # The printer renames what it must (duplicate or invalid names); with those names the
    # built graph and the parsed one are equal.
    names = printer_mod.GraphPrinter(g)
    names.assign_names()
    for v, n in names.names.items():
        v.name = n
    assert g.diff(g2) is None, g.diff(g2)


@pytest.mark.skipif(shared_graphs is None, reason="tests/strategies.py not available")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_shared_graphs_round_trip(data):
    g = data.draw(shared_graphs())
    printed = print_graph(g)
    g2, again = roundtrip(printed)
    assert again == printed
    assert g.diff(g2) is None, g.diff(g2)


# --- the parser's fast path and its general path agree --------------------------------------------

def _count_general(monkeypatch):
    calls = []
    real = parser_mod._Parser.parse_node

    def counting(self, g):
        calls.append(1)
        return real(self, g)

    monkeypatch.setattr(parser_mod._Parser, "parse_node", counting)
    return calls


def _force_general(text: str, how: str) -> str:
    out = []
    for line in text.splitlines():
        if re.match(r"\s+%.* = ", line):
            if how == "comment":
                line += "  // off the fast path"
            elif how == "spaces":
                line = re.sub(r" = ", "  =  ", line, count=1)
            elif how == "tabs":
                line = "\t" + line.strip().replace(" : ", "\t:\t")
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("how", ["comment", "spaces", "tabs"])
def test_fast_and_general_paths_agree(attr_ops, monkeypatch, how):
    texts = [DESIGN_MLP, BRIEF_EXAMPLE, ALL_KINDS, print_graph(parse(ALL_KINDS))]
    for text in texts:
        calls = _count_general(monkeypatch)
        fast = parse(text, "f.pir")
        fast_calls = len(calls)
        slow_text = _force_general(text, how)
        slow = parse(slow_text, "f.pir")
        n_nodes = len(slow)
        assert len(calls) - fast_calls == n_nodes, "every node line should take the general path"
        assert fast.diff(slow) is None, fast.diff(slow)
        assert print_graph(fast) == print_graph(slow)
        # Same locations, line for line (columns move only where the layout moved them).
        assert [n.text_loc.line for n in fast.nodes] == [n.text_loc.line for n in slow.nodes]
        if how == "comment":
            assert [n.text_loc for n in fast.nodes] == [n.text_loc for n in slow.nodes]
        monkeypatch.undo()


def test_a_node_may_continue_on_the_next_line():
    text = """graph @g(%x: f32[4,6]) -> (f32[4,2]) {
  %a = neg(%x) : f32[4,6]
      loc("m.py":7)
  %lo, %hi = split(%a) {axis=1, sizes=[2, 4]} : f32[4,2]
      , f32[4,4]
  // a comment between the types and the location
  loc("m.py":8:2)
  return %lo
}
"""
    g, printed = roundtrip(text)
    a, split = list(g.nodes)
    assert a.loc == Location("m.py", 7) and split.loc == Location("m.py", 8, 2)
    assert [r.type for r in split.results] == [TensorType((4, 2), f32), TensorType((4, 4), f32)]
    assert '%a = neg(%x) : f32[4,6] loc("m.py":7)' in printed


def test_printed_node_lines_take_the_fast_path(attr_ops, monkeypatch):
    text = print_graph(parse(ALL_KINDS))
    calls = _count_general(monkeypatch)
    parse(BRIEF_EXAMPLE)
    assert not calls
    parse(text)
    # Only the line whose string attribute holds escapes needs the general path.
    assert len(calls) == 1


def test_fast_path_declines_anything_doubtful(monkeypatch):
    """Lines that look like nodes but are not valid go to the general path, which reports them."""
    bad_lines = [
        "  %1 = neg(%x) : f32[4,,4]",                 # empty dim
        "  %1 = neg(%nope) : f32[4]",                  # undefined operand
        "  %x = neg(%x) : f32[4]",                     # redefinition
        "  %1, %1 = split(%x) {axis=0, sizes=[2, 2]} : f32[2], f32[2]",  # duplicate result
        "  %1 = nope(%x) : f32[4]",                    # unknown op
        "  %1 = neg(%x) {bogus=1} : f32[4]",           # unknown attribute
        "  %1 = gelu(%x) {approximate=\"tanh\",} : f32[4]",  # trailing comma
        "  %1 = neg(%x) : f99[4]",                     # unknown dtype
        "  %1 = neg(%x) : f32[4], f32[4]",             # more types than results
    ]
    for line in bad_lines:
        text = f"graph @g(%x: f32[4]) -> (f32[4]) {{\n{line}\n  return %x\n}}\n"
        with pytest.raises(partita.ParseError) as ei:
            parse(text, "bad.pir")
        assert str(ei.value).startswith("bad.pir:2:"), str(ei.value)
    # A comment inside the braces hides the '}', so the dict runs on to the next line.
    text = "graph @g(%x: f32[4]) -> (f32[4]) {\n  %1 = gelu(%x) {approximate=\"tanh\" // c} : f32[4]\n  return %x\n}\n"
    with pytest.raises(partita.ParseError, match=r"bad.pir:3:3: error: expected ',' or '}' in the attribute dict, "
                                                 r"found 'return'"):
        parse(text, "bad.pir")


STEP = """graph @step(%w: f32[4] param, %g: f32[4]) -> (f32[4] aliases(%w), f32[4]) {
  %0 = sub(%w, %g) : f32[4]
  return %0, %g
}
"""


def test_output_aliases_round_trip_clone_and_diff():
    g = parse(STEP)
    verify(g)
    assert g.output_aliases == [g.input("w"), None]
    assert print_graph(g) == STEP
    c = g.clone()
    assert c.output_alias(0) is c.input("w") and c.diff(g) is None
    c.set_outputs(c.outputs)  # no aliases given: none kept
    assert "output 0 aliases differ" in (g.diff(c) or "")


@pytest.mark.parametrize("bad, message", [
    (STEP.replace("aliases(%w), f32[4])", "aliases(%w), f32[4] aliases(%w))"), "two outputs alias the same input"),
    (STEP.replace("aliases(%w)", "aliases(%0)"), "may only alias a graph input"),
    (STEP.replace("aliases(%w)", "aliases(%g)").replace("%g: f32[4]", "%g: f32[5]")
     .replace("sub(%w, %g)", "sub(%w, %w)").replace("return %0, %g", "return %0, %0"), "differs from the input"),
    (STEP.replace("aliases(%w)", "aliasez(%w)"), "expected ',', ')' or aliases(%input)"),
])
def test_bad_aliases_are_parse_errors(bad, message):
    with pytest.raises(partita.PartitaError, match=re.escape(message)):
        parse(bad)


def test_verifier_rejects_an_alias_of_a_non_input():
    g = parse(STEP)
    g.output_aliases = [g.outputs[0], None]  # an edit that bypasses set_outputs
    with pytest.raises(partita.PartitaError, match="not a graph input"):
        verify(g)
