"""Limits of the text form: nesting depth, splats too large to build, and the ranges of
dense literals. Each case either parses (and prints back exactly) or raises a located
PartitaError; none may raise RecursionError or MemoryError, or change a value silently."""

from __future__ import annotations

import pickle

import ml_dtypes
import numpy as np
import pytest

import partita
from partita.ir import Builder, DenseAttr, Graph, ParseError, TensorType, f32, parse, print_graph, verify
from partita.ir import attrs as attrs_mod
from partita.ir.diagnostics import AttributeError_, DenseTooLargeError
from partita.ir.dtypes import DTYPES
from partita.ir.parser import MAX_DEPTH
from partita.ir.printer import format_attr
from partita.ops.registry import AttrSpec, format_attr_value

DEEP = 100_000


def const(ty: str, body: str) -> str:
    return f"graph @c() -> ({ty}) {{\n  %a = constant() {{value=dense<{ty}, {body}>}} : {ty}\n  return %a\n}}\n"


def sum_with(axes: str) -> str:
    return f"graph @s(%x: f32[2]) -> (f32[]) {{\n  %a = sum(%x) {{axes={axes}}} : f32[]\n  return %a\n}}\n"


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def parse_error(text: str, line: int, col: int, *expected: str) -> ParseError:
    """The error is at line:col, shows the line with a caret there, and says each of ``expected``."""
    with pytest.raises(ParseError) as ei:
        parse(text, "lim.pir")
    e = ei.value
    assert (e.loc.file, e.loc.line, e.loc.col) == ("lim.pir", line, col), str(e)[:300]
    lines = str(e).splitlines()
    assert lines[0].startswith(f"lim.pir:{line}:{col}: error: ")
    assert lines[2] == "  " + " " * (col - 1) + "^"
    for x in expected:
        assert x in e.message, e.message[:300]
    return e


def round_trips(text: str):
    g = parse(text, "ok.pir")
    verify(g)
    assert print_graph(g) == text
    return g


def col_of(text: str, needle: str) -> int:
    """1-based column of ``needle`` in line 2 of ``text``: the first one in the values of the
    dense literal when the line has one, else the first one."""
    line = text.splitlines()[1]
    start = line.index(", ", line.index("dense<")) + 2 if "dense<" in line else 0
    return line.index(needle, start) + 1


# --- B1: nesting depth of attribute lists ------------------------------------------------------

def test_attribute_list_at_the_depth_limit_reaches_the_attribute_check():
    # 64 lists are allowed by the grammar; `axes` wants a flat list, so normalize rejects it,
    # and its message shows the value shortened.
    text = sum_with(nested(MAX_DEPTH))
    e = parse_error(text, 2, col_of(text, "axes"), "sum: attribute 'axes' must be a list of integers",
                    "got [[[[[[[[[...]]]]]]]]]")
    assert len(e.message) < 200


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, DEEP])
def test_attribute_list_deeper_than_the_limit_is_a_located_error(depth):
    text = sum_with(nested(depth))
    # The caret is under the '[' that opens list number MAX_DEPTH + 1.
    parse_error(text, 2, col_of(text, "[") + MAX_DEPTH,
                f"attribute value nested deeper than {MAX_DEPTH} lists (the maximum depth)")


def test_deep_attribute_list_off_the_fast_path():
    # Spacing the printer never writes: the general path alone reads the line.
    text = sum_with(nested(DEEP)).replace("sum(%x) {", "sum( %x ) {")
    parse_error(text, 2, col_of(text, "[") + MAX_DEPTH, "nested deeper than 64 lists")


# --- B2: error messages about deep or long values --------------------------------------------

def deep_tuple(depth: int):
    v: object = 1
    for _ in range(depth):
        v = (v,)
    return v


@pytest.mark.parametrize("depth", [331, DEEP])
def test_attribute_error_message_truncates_a_deep_value(depth):
    v = deep_tuple(depth)
    assert format_attr_value(v) == "[" * 8 + "[...]" + "]" * 8
    with pytest.raises(AttributeError_, match=r"'axes' must be a list of integers, got \[{9}\.\.\.\]{9}$"):
        AttrSpec("axes", "ints").normalize(v, "sum")
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((2,), f32))
    with pytest.raises(AttributeError_, match=r"\[\.\.\.\]"):
        b.emit("sum", x, axes=v)


def test_attribute_error_message_shortens_a_long_list():
    assert format_attr_value(tuple(range(5))) == "[0, 1, 2, 3, 4]"
    assert format_attr_value([[1, 2], [True]]) == "[[1, 2], [true]]"
    long = format_attr_value(tuple(range(100_000)))
    assert long == "[" + ", ".join(map(str, range(16))) + ", ... (100000 items)]"


def test_printer_writes_a_deep_value_without_recursion():
    # Only code can build such a value (the parser stops at 64); printing it must not fail.
    assert format_attr(((1, 2), (), (3, (4,)))) == "[[1, 2], [], [3, [4]]]"
    assert format_attr(deep_tuple(DEEP)) == nested(DEEP)


# --- B3: nesting depth of dense literals --------------------------------------------------------

def test_dense_literal_at_the_depth_limit_round_trips():
    ty = "f32[" + ",".join(["1"] * MAX_DEPTH) + "]"
    g = round_trips(const(ty, nested(MAX_DEPTH, "2.5")))
    assert g.first.attrs["value"].array.shape == (1,) * MAX_DEPTH
    assert g.first.attrs["value"].array.reshape(-1).tolist() == [2.5]


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 495, DEEP])
def test_dense_literal_deeper_than_the_limit_is_a_located_error(depth):
    text = const("f32[2]", nested(depth, "1.0"))
    parse_error(text, 2, col_of(text, "[") + MAX_DEPTH,
                f"dense values nested deeper than {MAX_DEPTH} lists (the maximum depth")


def test_dense_type_with_more_dimensions_than_numpy_holds():
    ty = "f32[" + ",".join(["1"] * (MAX_DEPTH + 1)) + "]"
    text = const(ty, "0.0")
    parse_error(text, 2, text.splitlines()[1].index("dense<") + 7, f"has {MAX_DEPTH + 1} dimensions; a tensor has at most {MAX_DEPTH}")


@pytest.mark.parametrize("body", ["[[[]], [1.0]]", "[[], [[]]]", "[[1.0], []]", "[[1.0], 2.0]", "[1.0, [2.0]]"])
def test_ragged_dense_literals(body):
    text = const("f32[2,1]", body)
    parse_error(text, 2, col_of(text, body), "ragged nested list; the type says f32[2,1]")


@pytest.mark.parametrize("body,at,says", [
    ("[1.0, ]", "]", "takes numbers, found ']'"),
    ("[1.0 2.0]", "2.0", "expected ',' or ']' in the values of dense<f32[2]>, found '2.0'"),
    ("[1.0, none]", "none", "takes numbers, found none"),
    ("[1.0, f32]", "f32]", "takes numbers, found f32"),
])
def test_malformed_dense_literals(body, at, says):
    text = const("f32[2]", body)
    parse_error(text, 2, col_of(text, at), says)


# --- B4: splats are kept as one value -----------------------------------------------------------

HUGE = "f32[100000,100000]"          # 37 GiB as an array
ABSURD = "f32[100000,100000,100000]"  # 4 PB: no machine holds it


@pytest.mark.parametrize("ty", [HUGE, ABSURD, "f32[99999999999999999999999]"])
def test_huge_splat_parses_prints_and_verifies_without_building_it(ty):
    g = round_trips(const(ty, "0.5"))
    d = g.first.attrs["value"]
    assert d.is_lazy_splat() and d.is_splat() and d.splat_value() == 0.5
    assert d.type == g.first.results[0].type and d.shape == d.type.shape
    assert hash(d) == hash(DenseAttr.splat(0.5, d.shape, f32)) and d == DenseAttr.splat(0.5, d.shape, f32)
    assert d != DenseAttr.splat(0.25, d.shape, f32)
    assert d.is_lazy_splat()  # nothing above built the array


def test_building_a_splat_too_large_for_memory_is_refused():
    g = parse(const(ABSURD, "0.5"))
    with pytest.raises(DenseTooLargeError, match=r"dense<f32\[100000,100000,100000\]> \(a splat\) has "
                                                 r"1,000,000,000,000,000 elements .*GiB\), more than this machine's"):
        g.first.attrs["value"].array
    with pytest.raises(DenseTooLargeError, match="more than this machine's"):
        partita.run(g)


def test_a_splat_is_built_on_demand_and_equals_the_array(monkeypatch):
    g = round_trips(const("f32[3,4]", "1.5"))
    d = g.first.attrs["value"]
    ref = np.full((3, 4), 1.5, np.float32)
    assert d == DenseAttr(ref) and hash(d) == hash(DenseAttr(ref))
    (out,) = partita.run(g)
    assert out.dtype == np.float32 and np.array_equal(out, ref)
    (out_t,) = partita.run(g, backend="torch")
    assert np.array_equal(np.asarray(out_t), ref)
    assert not d.array.flags.writeable and d.array is d.array  # built once, read-only
    # The limit is the machine's memory: with 1 KiB, 48 bytes are fine and 4 KiB are not.
    monkeypatch.setattr(attrs_mod, "memory_limit", lambda: 1024)
    assert np.array_equal(parse(const("f32[3,4]", "1.5")).first.attrs["value"].array, ref)
    big = parse(const("f32[32,32]", "1.5")).first.attrs["value"]
    with pytest.raises(DenseTooLargeError, match=r"1,024 elements \(0.0 GiB\), more than this machine's 0.0 GiB"):
        big.array
    # A literal that lists its values is checked at parse time, at the literal.
    text = const("f32[300]", "[" + ", ".join(["1.0"] * 300) + "]")
    parse_error(text, 2, col_of(text, "[1.0"), "dense<f32[300]> has 300 elements", "more than this machine's")


def test_empty_and_one_element_splats_print_as_before():
    assert print_graph(parse(const("f32[1]", "7.0"))) == const("f32[1]", "[7.0]")
    assert print_graph(parse(const("f32[2,0]", "7.0"))) == const("f32[2,0]", "[[], []]")
    assert print_graph(parse(const("f32[]", "7.0"))) == const("f32[]", "7.0")
    assert parse(const("f32[2,0]", "7.0")).first.attrs["value"] == DenseAttr(np.zeros((2, 0), np.float32))
    assert DenseAttr.splat(True, (3,), DTYPES["bool"]) == DenseAttr(np.ones(3, bool))


def test_empty_tensor_with_a_huge_dimension_prints_briefly():
    # Nested down to the 0 it would be 10**12 lists; `[]` reads back as any empty tensor.
    g = round_trips(const("f32[1000000000000,0]", "[]"))
    assert g.first.attrs["value"].shape == (10**12, 0)


def test_empty_tensor_numpy_cannot_index():
    # Zero elements, but NumPy refuses the shape (a dim past 2**63): it is kept unbuilt, and
    # prints and parses back; building it is the located error.
    ty = "f8e4m3fnuz[99999999999999999999999,1,0]"
    d = round_trips(const(ty, "[]")).first.attrs["value"]
    assert d.size == 0 and d == parse(const(ty, "1.0")).first.attrs["value"]
    assert print_graph(parse(const(ty, "1.0"))) == const(ty, "[]")
    with pytest.raises(DenseTooLargeError, match="cannot be built as an array"):
        d.array
    assert parse(const("i8[3,0]", "[[], [], []]")).first.attrs["value"] == DenseAttr(np.zeros((3, 0), np.int8))


def test_splat_survives_pickling_unbuilt():
    d = parse(const(HUGE, "-2.0")).first.attrs["value"]
    d2 = pickle.loads(pickle.dumps(d))
    assert d2 == d and d2.is_lazy_splat() and d2.splat_value() == -2.0


def test_passes_use_a_huge_splat_without_building_it():
    text = (f"graph @p(%x: {HUGE}) -> ({HUGE}, {HUGE}) {{\n"
            f"  %c = constant() {{value=dense<{HUGE}, 1.0>}} : {HUGE}\n"
            f"  %d = add(%c, %c) : {HUGE}\n"
            f"  %y = mul(%x, %c) : {HUGE}\n"
            f"  return %d, %y\n}}\n")
    g = parse(text)
    c = g.first.attrs["value"]
    out = partita.optimize(g, passes="canonicalize,fold-constants,dce")
    printed = print_graph(out)
    # add of two splats folds to one `full`; x * 1 is x; nothing built the 37 GiB array.
    assert "full() {shape=[100000, 100000], value=2.0}" in printed, printed
    assert "mul" not in printed and "add" not in printed, printed
    assert c.is_lazy_splat()


def test_parallel_signature_of_a_splat_does_not_build_it():
    from partita.parallel.collective_order import _attr_text

    lazy = DenseAttr.splat(3.0, (4, 4), f32)
    assert _attr_text(lazy) == _attr_text(DenseAttr(np.full((4, 4), 3.0, np.float32)))
    assert _attr_text(parse(const(HUGE, "3.0")).first.attrs["value"]).startswith("dense<<f4[100000, 100000]:splat:")


# --- B5: literal ranges -------------------------------------------------------------------------

INT_RANGES = {"u2": (0, 3), "i2": (-2, 1), "u4": (0, 15), "i4": (-8, 7), "u8": (0, 255), "i8": (-128, 127),
              "u16": (0, 65535), "i16": (-32768, 32767), "u32": (0, 2**32 - 1), "i32": (-2**31, 2**31 - 1),
              "u64": (0, 2**64 - 1), "i64": (-2**63, 2**63 - 1)}


@pytest.mark.parametrize("name", list(INT_RANGES))
def test_integer_literals_in_range_round_trip(name):
    lo, hi = INT_RANGES[name]
    g = round_trips(const(f"{name}[3]", f"[{lo}, {hi}, 1]"))
    assert g.first.attrs["value"].array.tolist() == [lo, hi, 1]
    assert round_trips(const(f"{name}[2]", str(hi))).first.attrs["value"].splat_value() == hi


@pytest.mark.parametrize("name", list(INT_RANGES))
@pytest.mark.parametrize("where", ["low", "high", "splat"])
def test_integer_literals_out_of_range_are_errors(name, where):
    lo, hi = INT_RANGES[name]
    bad = lo - 1 if where == "low" else hi + 1
    body = f"[{lo}, {bad}]" if where != "splat" else str(bad)
    text = const(f"{name}[2]", body)
    col = col_of(text, f", {bad}]") + 2 if where != "splat" else col_of(text, str(bad))
    parse_error(text, 2, col, f"dense value {bad} is out of range for {name} ({lo}..{hi})")


def test_narrow_integers_no_longer_wrap():
    # These read as [4, -8, 7] before: now the first value out of range is the error.
    text = const("i4[3]", "[100, 8, -9]")
    parse_error(text, 2, col_of(text, "100"), "dense value 100 is out of range for i4 (-8..7)")


# Largest finite value, a value that rounds to it, and the first magnitude that rounds beyond.
FLOAT_EDGES = {
    "f8e4m3fn": ("448.0", "460.0", "465.0"),
    "f8e4m3fnuz": ("240.0", "247.0", "248.0"),
    "f8e5m2": ("57344.0", "61000.0", "61440.0"),
    "f8e5m2fnuz": ("57344.0", "61000.0", "61440.0"),
    "f4e2m1": ("6.0", "6.9", "7.0"),
    "f16": ("65504.0", "65519.0", "65520.0"),
    "f32": ("3.4028235e+38", "3.4028235e+38", "3.5e+38"),
}


@pytest.mark.parametrize("name", list(FLOAT_EDGES))
def test_float_literals_at_the_edge_of_the_range(name):
    top, rounds, beyond = FLOAT_EDGES[name]
    g = round_trips(const(f"{name}[2]", f"[{top}, -{top}]"))
    mx = float(ml_dtypes.finfo(DTYPES[name].np).max)
    assert g.first.attrs["value"].array.astype(np.float64).tolist() == [mx, -mx]
    got = parse(const(f"{name}[1]", f"[-{rounds}]")).first.attrs["value"].array.astype(np.float64)
    assert got.tolist() == [-mx]
    for body, at in ((f"[0.0, {beyond}]", beyond), (f"-{beyond}", f"-{beyond}")):
        text = const(f"{name}[2]", body)
        parse_error(text, 2, col_of(text, at), f"dense value {at} is out of range for {name} (finite values -")


@pytest.mark.parametrize("name,value,says", [
    ("f8e4m3fn", "inf", "which has no infinity (finite values -448.0..448.0)"),
    ("f8e4m3fnuz", "-inf", "which has no infinity"),
    ("f8e5m2fnuz", "inf", "which has no infinity"),
    ("f4e2m1", "inf", "which has no infinity (finite values -6.0..6.0)"),
    ("f4e2m1", "nan", "which has no NaN"),
    ("f8e8m0", "inf", "which has no infinity (powers of two 2**-127..2**127)"),
    ("f8e8m0", "0.0", "(powers of two 2**-127..2**127)"),
    ("f8e8m0", "-1.0", "(powers of two 2**-127..2**127)"),
    ("f8e8m0", "1e40", "(powers of two 2**-127..2**127)"),
    ("f64", "1e400", "(finite values -1.7976931348623157e+308..1.7976931348623157e+308)"),
    ("f32", "-1e400", "(finite values -3.4028235e+38..3.4028235e+38)"),
])
def test_float_literals_the_type_cannot_hold(name, value, says):
    for body in (f"[1.0, {value}]", value):
        text = const(f"{name}[2]", body)
        parse_error(text, 2, col_of(text, value), f"dense value {value} is out of range for {name}", says)


@pytest.mark.parametrize("name,body,want", [
    ("f8e5m2", "[inf, -inf, nan]", [np.inf, -np.inf, np.nan]),
    ("f8e4m3fn", "[nan, 0.001953125]", [np.nan, 2.0**-9]),
    ("f8e8m0", "[nan, 0.25, 1.7014118e+38]", [np.nan, 0.25, 2.0**127]),
    ("f4e2m1", "[-0.0, 0.5, 0.3]", [-0.0, 0.5, 0.5]),
    ("f16", "[inf, 1e-10]", [np.inf, 0.0]),
])
def test_float_literals_the_type_holds(name, body, want):
    g = parse(const(f"{name}[{len(want)}]", body))
    got = g.first.attrs["value"].array.astype(np.float64)
    np.testing.assert_array_equal(got, np.array(want))
    text = print_graph(g)
    assert print_graph(parse(text)) == text


def test_dense_values_across_lines_and_comments_are_located():
    # Values are read in runs where the text allows; an error is still at the value's own
    # line and column, whichever way it was read.
    head = "graph @c() -> (i8[2,3]) {\n  %a = constant() {value=dense<i8[2,3], [[1, 2, 3], // row 0\n"
    tail = "}  : i8[2,3]\n  return %a\n}\n"
    g = parse(head + "      [4,\n 5, 6]]>" + tail)
    assert g.first.attrs["value"].array.tolist() == [[1, 2, 3], [4, 5, 6]]
    with pytest.raises(ParseError) as ei:
        parse(head + "      [4,\n 5, 600]]>" + tail, "lim.pir")
    assert (ei.value.loc.line, ei.value.loc.col) == (4, 5)
    assert ei.value.message == "dense value 600 is out of range for i8 (-128..127)"
    bad = head.replace("[[1, 2, 3]", "[[1, 2, -300]")
    with pytest.raises(ParseError) as ei:
        parse(bad + "      [4,\n 5, 6]]>" + tail, "lim.pir")
    assert (ei.value.loc.line, ei.value.loc.col) == (2, bad.splitlines()[1].index("-300") + 1)


# --- integer literals beyond every float -------------------------------------------------

BEYOND_FLOAT = "1" * 400


@pytest.mark.parametrize("sign", ["", "-"])
def test_a_fill_value_beyond_every_float_is_a_located_error(sign):
    text = f"graph @f() -> (f32[2]) {{\n  %a = full() {{shape=[2], value={sign}{BEYOND_FLOAT}, dtype=f32}} : f32[2]\n  return %a\n}}\n"
    with pytest.raises(partita.PartitaError) as info:
        verify(parse(text))
    assert "out of range of a float" in str(info.value) and ":2:" in str(info.value)


@pytest.mark.parametrize("attr", [f"f={BEYOND_FLOAT}", f"fs=[1.0, -{BEYOND_FLOAT}]"])
def test_a_float_attribute_beyond_every_float_is_a_located_error(attr_ops, attr):
    text = f"graph @a(%x: f32[4]) -> (f32[4]) {{\n  %a = ir_test.attrs(%x) {{{attr}}} : f32[4]\n  return %a\n}}\n"
    with pytest.raises(partita.PartitaError) as info:
        parse(text)
    assert "out of range of a float" in str(info.value) and ":2:" in str(info.value)
