"""Every bad input gives a specific, located error; tested for what the message says."""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np
import pytest

import partita
from partita.ir import (Builder, ExecutionError, Graph, Location, Node, ParseError, PartitaError, TensorType,
                        VerifyError, Weights, WeightsError, f32, parse, verify)
from partita.ir.weights import load_safetensors, save_safetensors

GOOD = """graph @g(%x: f32[4], %w: f32[4] param) -> (f32[4]) {
  %a = add(%x, %w) : f32[4]
  %b = gelu(%a) {approximate="tanh"} : f32[4]
  return %b
}
"""


def parse_error(text: str, line: int, at: str, *expected: str, file: str = "bad.pir", nth: int = 0) -> str:
    """Parse ``text``: the error must point at line ``line``, at the ``nth`` occurrence of ``at``
    in that line, show that line with a caret under it, and contain each ``expected``."""
    with pytest.raises(ParseError) as ei:
        parse(text, file)
    err = ei.value
    src = text.splitlines()[line - 1] if text.splitlines() else ""
    col = -1
    for _ in range(nth + 1):
        col = src.index(at, col + 1)
    col += 1
    msg = str(err)
    lines = msg.splitlines()
    assert lines[0].startswith(f"{file}:{line}:{col}: error: "), msg
    assert (err.loc.file, err.loc.line, err.loc.col) == (file, line, col)
    if src:
        assert lines[1] == "  " + src.expandtabs(1)
        assert lines[2] == "  " + " " * (col - 1) + "^"
    for e in expected:
        assert e in lines[0], f"{e!r} not in {lines[0]!r}"
    return lines[0]


# --- malformed text ------------------------------------------------------------------------------

def test_empty_file():
    for text in ("", "   \n\n", "// only a comment\n"):
        with pytest.raises(ParseError) as ei:
            parse(text, "empty.pir")
        assert "expected 'graph', found end of input (the file is empty)" in str(ei.value)
        assert str(ei.value).startswith("empty.pir:")


def test_missing_close_paren_in_operands():
    text = GOOD.replace("add(%x, %w)", "add(%x, %w")
    parse_error(text, 2, ":", "expected ',' or ')' after an operand, found ':'")


def test_missing_close_paren_in_header():
    text = GOOD.replace("%w: f32[4] param)", "%w: f32[4] param")
    parse_error(text, 1, "->", "expected ',' or ')' after a graph input, found '->'")


def test_missing_close_brace_at_end():
    text = GOOD.rstrip().rstrip("}") + "\n\n"
    with pytest.raises(ParseError) as ei:
        parse(text, "bad.pir")
    # End of input is shown where the text stops, right after "return %b", not on a blank line.
    assert str(ei.value).splitlines() == [
        "bad.pir:4:12: error: expected '}' to close the graph body, found end of input",
        "    return %b",
        "             ^"]


def test_bad_type():
    parse_error(GOOD.replace("%w: f32[4]", "%w: f23[4]"), 1, "f23",
                "expected a tensor type like f32[4,8], found 'f23' (did you mean 'f32'?)")
    parse_error(GOOD.replace(": f32[4]\n  %b", ": float[4]\n  %b"), 2, "float",
                "expected a tensor type like f32[4,8], found 'float'")
    parse_error(GOOD.replace("-> (f32[4])", "-> (f32)"), 1, ")", "expected '[' and the shape after f32, found ')'",
                nth=1)


def test_bad_dims():
    parse_error(GOOD.replace("%x: f32[4]", "%x: f32[-4]"), 1, "-4",
                "expected a dimension size (a non-negative integer), found '-4'")
    parse_error(GOOD.replace("%x: f32[4]", "%x: f32[2.5]"), 1, "2.5", "found '2.5'")
    parse_error(GOOD.replace("%x: f32[4]", "%x: f32[4,]"), 1, "]", "found ']'")
    parse_error(GOOD.replace("%x: f32[4]", "%x: f32[4 4]"), 1, "4]", "expected ',' or ']' in the shape, found '4'",
                nth=0)
    # The same on a node line (the fast path must hand it to the general one).
    parse_error(GOOD.replace("add(%x, %w) : f32[4]", "add(%x, %w) : f32[4,,4]"), 2, ",4]",
                "expected a dimension size (a non-negative integer), found ','")


def test_unterminated_string():
    text = GOOD.replace('approximate="tanh"', 'approximate="tanh')
    parse_error(text, 3, '"', "unterminated string: add the closing '\"' before the end of the line")


def test_bad_escape_in_string():
    text = GOOD.replace('approximate="tanh"', 'approximate="ta\\qnh"')
    parse_error(text, 3, "\\q", "invalid escape in string")


def test_unexpected_character():
    parse_error(GOOD.replace("%a = add", "%a = $add"), 2, "$", "unexpected character '$'")


def test_junk_after_graph():
    text = GOOD + "graph @h() -> () {\n  return\n}\n"
    parse_error(text, 6, "graph", "expected end of input after the graph's closing '}', found 'graph'")
    parse_error(GOOD + "  %z\n", 6, "%z", "found '%z'")


def test_missing_arrow_and_body():
    parse_error(GOOD.replace(" -> (f32[4])", ""), 1, "{", "expected '->' and the output types, found '{'")
    parse_error(GOOD.replace(") {\n", ")\n", 1), 2, "%a", "expected '{' to open the graph body, found '%a'")


def test_bad_input_role():
    parse_error(GOOD.replace("f32[4] param", "f32[4] weight"), 1, "weight",
                "unknown input role 'weight'; expected one of input, param, state")


def test_bad_loc():
    parse_error(GOOD.replace(': f32[4]\n  %b', ': f32[4] loc("m.py":1.5)\n  %b'), 2, "1.5",
                "expected a line number (a non-negative integer), found '1.5'")
    parse_error(GOOD.replace(': f32[4]\n  %b', ': f32[4] loc(m.py:1)\n  %b'), 2, "m.py",
                "expected a quoted file name in loc(\"file\":line), found 'm.py'")
    parse_error(GOOD.replace(': f32[4]\n  %b', ': f32[4] loc("m.py":1:x)\n  %b'), 2, "x)",
                "expected a column number (a non-negative integer), found 'x'")


def test_result_and_type_counts_must_agree():
    text = GOOD.replace("%a = add(%x, %w) : f32[4]", "%a = add(%x, %w) : f32[4], f32[4]")
    parse_error(text, 2, "%a", "add names 1 result(s) but gives 2 type(s)")


def test_errors_name_the_file_given():
    with pytest.raises(ParseError) as ei:
        parse("graph", "models/x.pir")
    assert str(ei.value).startswith("models/x.pir:1:6: error: expected a graph name like @main, found end of input")


# --- ops and attributes ---------------------------------------------------------------------------

def test_unknown_op_with_suggestion():
    parse_error(GOOD.replace("add(", "addd("), 2, "addd", "unknown op 'addd' (did you mean 'add'?)")
    parse_error(GOOD.replace("gelu(", "geluu("), 3, "geluu", "unknown op 'geluu' (did you mean 'gelu'?)")
    line = parse_error(GOOD.replace("add(", "zzzzqq("), 2, "zzzzqq", "unknown op 'zzzzqq'")
    assert "did you mean" not in line


def test_wrong_attribute_type():
    parse_error(GOOD.replace('approximate="tanh"', "approximate=3"), 3, "approximate",
                "gelu: attribute 'approximate' must be a quoted string, got 3")
    parse_error(GOOD.replace('approximate="tanh"', 'approximate="fast"'), 3, "approximate",
                "gelu: attribute 'approximate' must be one of 'none', 'tanh', got 'fast'")
    text = """graph @g(%x: f32[4,4]) -> (f32[4]) {
  %s = sum(%x) {axes=1.5} : f32[4]
  return %s
}
"""
    parse_error(text, 2, "axes", "sum: attribute 'axes' must be a list of integers, got 1.5")
    parse_error(text.replace("axes=1.5", "axes=[0], keepdim=1"), 2, "keepdim",
                "sum: attribute 'keepdim' must be true or false, got 1")
    parse_error(text.replace("axes=1.5", "axes=[x]"), 2, "x]",
                "expected an attribute value (number, true/false, \"string\", dtype, [list] or dense<...>), found 'x'")


def test_unknown_and_missing_attributes():
    parse_error(GOOD.replace('approximate="tanh"', 'aproximate="tanh"'), 3, "aproximate",
                "gelu: unknown attribute 'aproximate' (did you mean 'approximate'?); its attributes are: approximate")
    parse_error(GOOD.replace('{approximate="tanh"}', '{approximate="tanh", approximate="none"}'), 3, "approximate",
                "attribute 'approximate' given twice", nth=1)
    text = GOOD.replace('gelu(%a) {approximate="tanh"}', "cast(%a)")
    parse_error(text, 3, "cast", "cast: missing required attribute 'dtype' (a dtype name (f32, i64, ...))")


def test_dense_literal_errors():
    def text(body: str, ty: str = "f32[2]") -> str:
        return f"graph @c() -> ({ty}) {{\n  %a = constant() {{value=dense<{ty}, {body}>}} : {ty}\n  return %a\n}}\n"

    parse_error(text("[1.0, 2.0, 3.0]"), 2, "[1.0", "dense values have shape [3] but the type says f32[2]")
    parse_error(text("[[1.0], 2.0]"), 2, "[[1.0]", "ragged nested list; the type says f32[2]")
    # A value of the wrong kind or out of range: the caret is under that value.
    parse_error(text("[1.5, 2]", "i64[2]"), 2, "1.5", "dense<i64[2]> takes integers, found 1.5")
    parse_error(text("[1, 0]", "bool[2]"), 2, "1, 0", "dense<bool[2]> takes true or false, found 1")
    parse_error(text("[true, 1.0]"), 2, "true", "dense<f32[2]> takes numbers, found true")
    parse_error(text('"ab"'), 2, '"ab"', 'dense<f32[2]> takes numbers, found "ab"')
    parse_error(text("[1, 300]", "u8[2]"), 2, "300", "dense value 300 is out of range for u8 (0..255)")
    parse_error(text("[1e39, 0.0]"), 2, "1e39", "dense value 1e39 is out of range for f32",
                "finite values -3.4028235e+38..3.4028235e+38")
    parse_error(text("[0.0, 70000.0]", "f16[2]"), 2, "70000", "dense value 70000.0 is out of range for f16")
    parse_error(text("[1e39, 0.0]", "bf16[2]"), 2, "1e39", "dense value 1e39 is out of range for bf16")
    parse_error(text("[1.0, 2.0]").replace("dense<f32[2],", "dense<f32[2]"), 2, "[1.0",
                "expected ',' between the type and the values of dense<...>, found '['")


# --- SSA --------------------------------------------------------------------------------------------

def test_use_before_definition():
    text = """graph @g(%x: f32[4]) -> (f32[4]) {
  %a = neg(%b) : f32[4]
  %b = neg(%x) : f32[4]
  return %a
}
"""
    parse_error(text, 2, "%b", "%b is used before its definition at line 3; nodes must be listed in topological order")


def test_undefined_value_with_suggestion():
    parse_error(GOOD.replace("gelu(%a)", "gelu(%aa)"), 3, "%aa", "use of undefined value %aa (did you mean 'a'?)")
    parse_error(GOOD.replace("return %b", "return %q"), 4, "%q", "use of undefined value %q")


def test_duplicate_definitions():
    text = GOOD.replace("%b = gelu(%a)", "%a = gelu(%a)").replace("return %b", "return %a")
    parse_error(text, 3, "%a", "%a is defined twice (first at line 2); SSA values are defined once")
    text = GOOD.replace("%a = add(%x, %w)", "%x = add(%x, %w)").replace("gelu(%a)", "gelu(%x)")
    parse_error(text, 2, "%x", "%x is defined twice (first at line 1)")
    parse_error(GOOD.replace("%w: f32[4] param", "%x: f32[4] param"), 1, "%x", "%x is defined twice (first at line 1)",
                nth=1)


def test_cycles_are_named():
    text = """graph @g(%x: f32[4]) -> (f32[4]) {
  %a = neg(%b) : f32[4]
  %c = relu(%x) : f32[4]
  %b = add(%a, %c) : f32[4]
  return %b
}
"""
    parse_error(text, 2, "%b", "%b is used before its definition at line 4, and cannot be moved up: "
                               "the values form a cycle (%b -> %a -> %b)")
    three = """graph @g(%x: f32[4]) -> (f32[4]) {
  %a = neg(%c) : f32[4]
  %b = relu(%a) : f32[4]
  %c = abs(%b) : f32[4]
  return %c
}
"""
    # "x -> y" reads "x is used by y".
    parse_error(three, 2, "%c", "the values form a cycle (%c -> %a -> %b -> %c)")
    parse_error(GOOD.replace("add(%x, %w)", "add(%a, %w)"), 2, "%a", "%a is used in its own definition", nth=1)


def test_outputs_must_match_signature():
    parse_error(GOOD.replace("-> (f32[4])", "-> (f32[5])"), 1, "f32[5]",
                "output %b has type f32[4] but the graph signature declares f32[5]")
    parse_error(GOOD.replace("-> (f32[4])", "-> (f32[4], f32[4])"), 4, "return",
                "return has 1 value(s) but the graph signature declares 2 output type(s)")
    parse_error(GOOD.replace("return %b", "return"), 4, "return",
                "return has 0 value(s) but the graph signature declares 1 output type(s)")


# --- the verifier ---------------------------------------------------------------------------------

MISMATCH = """graph @g(%x: f32[4]) -> (f32[4]) {
  %a = neg(%x) : f32[4]
  %b = add(%a, %x) : f32[5]
  %c = neg(%b) : f32[5]
  %d = relu(%a) : f32[4]
  return %d
}
"""


def test_type_mismatch_names_node_and_marks_the_line():
    g = parse(MISMATCH, "m.pir")
    with pytest.raises(VerifyError) as ei:
        verify(g)
    lines = str(ei.value).splitlines()
    assert lines[0] == "m.pir:3:8: error: node %b = add has result type(s) f32[5] but the type rule of add gives f32[4]"
    assert lines[1:] == ["  | graph @g(%x: f32[4]) -> (f32[4]) {",
                         "  |   %a = neg(%x) : f32[4]",
                         "> |   %b = add(%a, %x) : f32[5]",
                         "  |   %c = neg(%b) : f32[5]",
                         "  |   %d = relu(%a) : f32[4]"]


def test_type_rule_errors_are_reported_on_the_node():
    text = MISMATCH.replace("add(%a, %x) : f32[5]", "add(%a, %y) : f32[5]").replace("(%x: f32[4])", "(%x: f32[4], %y: f32[5])")
    g = parse(text, "m.pir")
    with pytest.raises(VerifyError) as ei:
        verify(g)
    first = str(ei.value).splitlines()[0]
    assert first.startswith("m.pir:3:8: error: node %b = add is invalid: add: shapes [4] and [5] do not broadcast")
    assert "> |   %b = add(%a, %y) : f32[5]" in str(ei.value)


def test_built_graph_errors_use_the_source_location():
    g = Graph("built")
    b = Builder(g, loc=Location("model.py", 42))
    x = b.input("x", TensorType((4,), f32))
    y = b.neg(x)
    b.ret(y)
    y.producer.results[0].type = TensorType((3,), f32)  # a buggy pass retyped it
    with pytest.raises(VerifyError) as ei:
        verify(g)
    first = str(ei.value).splitlines()[0]
    # The unnamed result is called what the IR below calls it.
    assert first == "model.py:42: error: node %0 = neg has result type(s) f32[3] but the type rule of neg gives f32[4]"
    assert "> |   %0 = neg(%x) : f32[3] loc(\"model.py\":42)" in str(ei.value)


def test_verifier_attribute_checks():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((4, 4), f32))
    s = b.sum(x, axes=[1])
    b.ret(s)
    node = s.producer
    node.attrs = {"axes": [1], "keepdim": False}
    with pytest.raises(VerifyError, match="has an attribute value that is not immutable"):
        verify(g)
    node.attrs = {"axes": (1,)}
    with pytest.raises(VerifyError, match=r"node %0 = sum is invalid: attributes .* are not in normal form"):
        verify(g)
    node.attrs = {"axes": (1,), "keepdim": False, "bogus": 1}
    with pytest.raises(VerifyError, match="sum: unknown attribute 'bogus'"):
        verify(g)
    node.attrs = {"axes": (1,), "keepdim": False}
    node.op = "summ"
    with pytest.raises(VerifyError, match=r"uses unknown op 'summ' \(did you mean 'sum'\?\)"):
        verify(g)
    node.op = "sum"
    verify(g)


def test_verifier_result_count():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((4,), f32))
    n = g.append(Node("neg", [x], {}, [TensorType((4,), f32)] * 2))
    b.ret(n.results[0])
    with pytest.raises(VerifyError, match=r"node %0, %1 = neg has 2 result.s. but neg produces 1"):
        verify(g)


def test_verifier_foreign_operand():
    g = Graph("g")
    b = Builder(g)
    x = b.input("x", TensorType((4,), f32))
    y = b.neg(x)
    b.ret(y)
    other = Graph("o")
    z = other.add_input("z", TensorType((4,), f32))
    y.producer.operands[0] = z  # bypassing the edit API
    with pytest.raises(VerifyError, match=r"operand 0 \(%z\) is a value from another graph"):
        verify(g)


# --- running ----------------------------------------------------------------------------------------

MLP = """graph @mlp(%x: f32[2,3], %w1: f32[3,4] param, %b1: f32[4] param) -> (f32[2,4]) {
  %0 = matmul(%x, %w1) : f32[2,4]
  %1 = add(%0, %b1) : f32[2,4]
  return %1
}
"""


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_missing_weights_names_the_params(tmp_path, backend):
    path = tmp_path / "mlp.pir"
    path.write_text(MLP)
    g = partita.load(path)  # no .safetensors beside it
    assert len(g.weights) == 0
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ExecutionError) as ei:
        partita.run(g, [x], backend=backend)
    msg = str(ei.value)
    assert "@mlp: no value given for %w1 (param), %b1 (param)" in msg
    assert "weights are loaded from the .safetensors file beside the .pir file" in msg
    g.weights["w1"] = np.ones((3, 4), np.float32)
    with pytest.raises(ExecutionError, match=r"no value given for %b1 \(param\)"):
        partita.run(g, [x], backend=backend)


def test_wrong_inputs_are_execution_errors():
    g = parse(MLP)
    w = {"w1": np.ones((3, 4), np.float32), "b1": np.ones(4, np.float32)}
    with pytest.raises(ExecutionError, match=r"@mlp takes 1 input\(s\) \(%x\), got 2"):
        partita.run(g, [np.zeros((2, 3), np.float32)] * 2, w)
    with pytest.raises(ExecutionError, match=r"input %x \(input\) expects f32\[2,3\], got f32\[3,3\]"):
        partita.run(g, [np.zeros((3, 3), np.float32)], w)
    with pytest.raises(ExecutionError, match="@mlp has no input named y"):
        partita.run(g, {"y": np.zeros(2)}, w)
    with pytest.raises(PartitaError, match="unknown backend 'jax'"):
        partita.run(g, [np.zeros((2, 3), np.float32)], w, backend="jax")


def test_load_missing_or_unreadable_pir(tmp_path):
    with pytest.raises(PartitaError, match="no such file"):
        partita.load(tmp_path / "nope.pir")
    with pytest.raises(PartitaError, match="cannot read the file"):
        partita.load(tmp_path)
    (tmp_path / "bin.pir").write_bytes(b"\xff\xfe\x00graph")
    with pytest.raises(PartitaError, match="not a text file"):
        partita.load(tmp_path / "bin.pir")


# --- weights files ----------------------------------------------------------------------------------

def write_st(path, header: dict | bytes, data: bytes = b"", n: int | None = None) -> None:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head) if n is None else n) + head + data)


def weights_error(path, *expected: str) -> str:
    with pytest.raises(WeightsError) as ei:
        Weights.load(path)
    msg = str(ei.value)
    assert msg.startswith(f"{path}: "), msg
    for e in expected:
        assert e in msg, f"{e!r} not in {msg!r}"
    return msg


def test_weights_round_trip_every_dtype(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal(5),
        "f16": rng.standard_normal((2, 2)).astype(np.float16),
        "bf16": rng.standard_normal((3, 5)).astype(ml_dtypes.bfloat16),
        "i64": rng.integers(-2**62, 2**62, 4),
        "i32": rng.integers(-100, 100, (2, 3)).astype(np.int32),
        "i16": np.array([-3, 7], np.int16),
        "i8": np.array([-128, 127], np.int8),
        "u8": np.array([0, 255], np.uint8),
        "bool": np.array([[True, False], [False, True]]),
        "scalar": np.float32(2.5),
        "empty": np.zeros((0, 3), np.float32),
        "big_endian": np.arange(4, dtype=">f4"),
        "strided": np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
    }
    w = Weights(arrays)
    path = tmp_path / "w.safetensors"
    w.save(path)
    back = Weights.load(path)
    assert list(back) == list(arrays)
    for k, a in arrays.items():
        a = np.asarray(a)
        assert back[k].shape == a.shape, k
        assert back[k].dtype == a.dtype.newbyteorder("="), k
        np.testing.assert_array_equal(back[k], a)
    assert back["bf16"].tobytes() == arrays["bf16"].tobytes()
    assert back.nbytes == sum(np.asarray(a).nbytes for a in arrays.values())
    # The file is readable by the format's rules: header length, JSON, offsets in order.
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert header["bf16"]["dtype"] == "BF16" and header["bf16"]["shape"] == [3, 5]
    assert n % 8 == 0


def test_weights_torch_reads_bf16_the_same(tmp_path):
    import torch

    a = np.array([1.5, -2.25, 3.0e10], ml_dtypes.bfloat16)
    path = tmp_path / "w.safetensors"
    Weights({"a": a}).save(path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    t = torch.frombuffer(bytearray(raw[8 + n:]), dtype=torch.bfloat16)
    assert t.tolist() == a.astype(np.float32).tolist()


def test_weights_rejects_unsupported_dtypes():
    with pytest.raises(WeightsError, match="weight 'c' has dtype complex64, which partita does not support"):
        Weights({"c": np.zeros(2, np.complex64)})
    with pytest.raises(WeightsError, match="weight names are strings"):
        Weights()[3] = np.zeros(2)


def test_atomic_save_writes_tmp_then_renames(tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    Weights({"a": np.zeros(3, np.float32)}).save(path)
    old = path.read_bytes()
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        # At the moment of the rename the new content is complete in the .tmp file and the
        # old file is still in place.
        seen.append((str(src), str(dst), load_safetensors(src)["a"].tolist(), path.read_bytes() == old))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    Weights({"a": np.ones(3, np.float32)}).save(path)
    assert seen == [(str(path) + ".tmp", str(path), [1.0, 1.0, 1.0], True)]
    assert not (tmp_path / "w.safetensors.tmp").exists()
    assert Weights.load(path)["a"].tolist() == [1.0, 1.0, 1.0]


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "w.safetensors"
    Weights({"a": np.zeros(3, np.float32)}).save(path)
    old = path.read_bytes()

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(WeightsError, match="cannot write the weights file .No space left on device."):
        Weights({"a": np.ones(3, np.float32)}).save(path)
    assert path.read_bytes() == old
    assert not (tmp_path / "w.safetensors.tmp").exists()
    monkeypatch.undo()
    with pytest.raises(WeightsError, match="cannot write the weights file"):
        Weights({"a": np.ones(3)}).save(tmp_path / "no" / "such" / "dir.safetensors")


def test_missing_weights_file(tmp_path):
    weights_error(tmp_path / "none.safetensors", "weights file not found")
    weights_error(tmp_path, "cannot read the weights file")


def test_truncated_weights_files(tmp_path):
    path = tmp_path / "w.safetensors"
    Weights({"a": np.arange(6, dtype=np.float32), "b": np.ones(2, np.int64)}).save(path)
    full = path.read_bytes()
    (n,) = struct.unpack("<Q", full[:8])
    path.write_bytes(b"")
    weights_error(path, "not a safetensors file (only 0 bytes)")
    path.write_bytes(full[:5])
    weights_error(path, "not a safetensors file (only 5 bytes)")
    path.write_bytes(full[:8 + n - 3])
    weights_error(path, f"header of {n} bytes runs past the end of the file", "truncated or corrupt")
    path.write_bytes(full[:-4])
    weights_error(path, "tensor 'b' has data offsets", "truncated or corrupt")
    for cut in range(8 + n, len(full)):
        path.write_bytes(full[:cut])
        with pytest.raises(WeightsError):
            Weights.load(path)


def test_corrupt_weights_headers(tmp_path):
    p = tmp_path / "w.safetensors"
    write_st(p, b"\xff\xfe not json")
    weights_error(p, "corrupt safetensors header")
    write_st(p, b"{not json}")
    weights_error(p, "corrupt safetensors header")
    write_st(p, b"[1, 2]")
    weights_error(p, "corrupt safetensors header (not a JSON object)")
    write_st(p, b"{}", n=2**63)
    weights_error(p, "runs past the end of the file")
    cases = [
        ({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4),
        ({"a": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}, b"\0" * 4),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4),
        ({"a": {"dtype": "F32", "shape": [1]}}, b"\0" * 4),
        ({"a": [1, 2, 3]}, b""),
        ({"a": "F32"}, b""),
    ]
    for header, data in cases:
        write_st(p, header, data)
        weights_error(p, "tensor 'a' has an invalid or unsupported entry")
    write_st(p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 8)
    weights_error(p, "tensor 'a' has data offsets 0..4 that do not fit its shape [2]")
    write_st(p, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, b"\0" * 8)
    weights_error(p, "data offsets 8..4")
    # Metadata is allowed and ignored.
    write_st(p, {"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
             np.float32(3).tobytes())
    assert Weights.load(p)["a"].tolist() == [3.0]


def test_corrupt_weights_beside_a_pir_file(tmp_path):
    (tmp_path / "mlp.pir").write_text(MLP)
    (tmp_path / "mlp.safetensors").write_bytes(b"\x01\x00")
    with pytest.raises(WeightsError, match="mlp.safetensors: not a safetensors file"):
        partita.load(tmp_path / "mlp.pir")


def test_save_safetensors_function_is_atomic_too(tmp_path):
    p = tmp_path / "x.safetensors"
    save_safetensors(p, {"a": np.arange(3, dtype=np.int32)})
    assert load_safetensors(p)["a"].tolist() == [0, 1, 2]
    assert [q.name for q in tmp_path.iterdir()] == ["x.safetensors"]
