"""Mutated ``.pir`` text: the parser and verifier accept it or raise PartitaError, nothing else.

Mutations work on characters, tokens and lines of a few valid seed graphs. Text that is
accepted must also survive print -> parse unchanged, so the fuzzer checks the printer on
every odd input the parser lets through.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from partita.ir import PartitaError, Weights, WeightsError, parse, print_graph, verify
from partita.ir import parser as parser_mod
from partita.ir.printer import GraphPrinter

from .test_placement_text import GLOBAL_PRINTED
from .test_text import ALL_KINDS, BRIEF_EXAMPLE, DESIGN_MLP

CONSTANTS = r"""graph @c(%s: f32[], %z: f32[0,3]) -> (f32[2,2], f32[3]) {
  %0 = constant() {value=dense<f32[2,2], [[1.0, -inf], [nan, 2.5]]>} : f32[2,2]
  %1 = sum(%z) {axes=[0]} : f32[3] loc("m \"q\".py":3:4)
  %2 = cast(%1) {dtype=i64} : i64[3] // comment
  %b = constant() {value=dense<bool[2], true>} : bool[2]
  %i = constant() {value=dense<i64[], -3>} : i64[]
  %h = constant() {value=dense<bf16[0,2], []>} : bf16[0,2]
  return %0, %1
}
"""

SEEDS = [DESIGN_MLP, BRIEF_EXAMPLE, ALL_KINDS, CONSTANTS, GLOBAL_PRINTED]

_TOKEN = re.compile(r'\s+|%[\w.]+|@[\w.]+|-?\d[\w.+-]*|\w+|"(?:[^"\\\n]|\\.)*"|->|//[^\n]*|.')
VOCAB = ["%", "%0", "%x", "%1, %2", "@g", "(", ")", "[", "]", "{", "}", ",", ":", "=", "->", "<", ">",
         "dense", "dense<f32[2], 1.0>", "f32", "i64", "bool", "bf16", "f32[]", "f32[0]", "param", "state",
         "return", "graph", "loc", 'loc("a":1)', '"', '"s"', '"\\q"', "\\", "1e5", "-1", "nan", "inf", "-inf",
         "true", "false", "none", "//", "\n", " ", "\t", "\r\n", "\x00", "\u00e9", "\u0663", "0", "1.5",
         "99999999999999999999", "1e400", "-0.0", ".5", "matmul", "split", "constant", "sum", "add", "cast",
         "@dp", "@tp", "@", "partial", "partial(tp)", " partial(dp, tp)", "mesh", " mesh(dp=2)", "mesh(tp=4)"]


@st.composite
def mutated_text(draw) -> str:
    text = draw(st.sampled_from(SEEDS))
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        kind = draw(st.sampled_from(["del_char", "ins_char", "rep_char", "del_tok", "ins_tok", "rep_tok",
                                     "swap_lines", "dup_line", "del_line", "truncate"]))
        lines = text.split("\n")
        toks = [m.span() for m in _TOKEN.finditer(text)]
        i = draw(st.integers(0, len(text) - 1))
        a, b = toks[draw(st.integers(0, len(toks) - 1))]
        char = draw(st.characters(min_codepoint=0, max_codepoint=0x2FF, exclude_categories=["Cs"]))
        if kind == "del_char":
            text = text[:i] + text[i + 1:]
        elif kind == "ins_char":
            text = text[:i] + char + text[i:]
        elif kind == "rep_char":
            text = text[:i] + char + text[i + 1:]
        elif kind == "del_tok":
            text = text[:a] + text[b:]
        elif kind == "ins_tok":
            text = text[:a] + draw(st.sampled_from(VOCAB)) + text[a:]
        elif kind == "rep_tok":
            text = text[:a] + draw(st.sampled_from(VOCAB)) + text[b:]
        elif kind == "swap_lines":
            x, y = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[x], lines[y] = lines[y], lines[x]
            text = "\n".join(lines)
        elif kind == "dup_line":
            x = draw(st.integers(0, len(lines) - 1))
            lines.insert(x, lines[x])
            text = "\n".join(lines)
        elif kind == "del_line":
            del lines[draw(st.integers(0, len(lines) - 1))]
            text = "\n".join(lines)
        else:
            text = text[:i]
    return text


def check_text(text: str) -> None:
    try:
        g = parse(text, "fuzz.pir")
        verify(g)
    except PartitaError as e:
        msg = str(e)
        assert msg.strip(), "empty error message"
        return
    except Exception as e:  # noqa: BLE001  (the point of the test)
        pytest.fail(f"{type(e).__name__}: {e}\non input:\n{text!r}")
    # Accepted: the printer must reproduce it.
    try:
        printed = print_graph(g)
        g2 = parse(printed, "printed.pir")
        verify(g2)
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"accepted input does not survive print -> parse: {type(e).__name__}: {e}\n"
                    f"input:\n{text!r}")
    names = GraphPrinter(g)
    names.assign_names()
    for v, n in names.names.items():
        v.name = n
    assert g.diff(g2) is None, f"{g.diff(g2)}\ninput:\n{text!r}"
    assert print_graph(g2) == printed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated_text())
@example(text="\\graph @g() -> () {\n  return\n}\n")     # an error while lexing the first token
@example(text=DESIGN_MLP.replace("f32[32,256]", "f32[32,,256]"))
@example(text=DESIGN_MLP.replace(": f32[32,256]", ': f32[32,256] loc("a":1.5)'))
@example(text=DESIGN_MLP.replace(": f32[32,256]", ': f32[32,256] loc("a\\q":1)'))
@example(text=CONSTANTS.replace("[[1.0, -inf], [nan, 2.5]]", "[[1.0, -inf], [none, 2.5]]"))
@example(text=CONSTANTS.replace("dense<i64[], -3>", "dense<i64[], 1e400>"))
@example(text=CONSTANTS.replace("dense<bool[2], true>", "dense<bool[2], [dense<bool[1], true>, true]>"))
def test_mutated_text_is_accepted_or_rejected_cleanly(attr_ops, text):
    check_text(text)


def _outcome(text: str, fast: bool):
    with pytest.MonkeyPatch.context() as mp:
        if not fast:
            mp.setattr(parser_mod._Parser, "fast_nodes", lambda self, g, pos: pos)
        try:
            return parse(text, "fuzz.pir")
        except PartitaError as e:
            return str(e)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=mutated_text())
@example(text=DESIGN_MLP.replace(": f32[32,256]\n", ': f32[32,256]\n      loc("m.py":4)\n', 1))
@example(text=BRIEF_EXAMPLE.replace(": f32[32,128], f32[32,128]", ": f32[32,128]\n    , f32[32,128]"))
@example(text=DESIGN_MLP.rstrip() + "\n\n// trailing\n")
@example(text=GLOBAL_PRINTED.replace("256@tp]\n  %2", "256@tp]\n    partial(dp)\n  %2"))
@example(text=GLOBAL_PRINTED.replace(": f32[32@dp,256@tp]\n  %2", ": f32[32,256]\n    partial(tp)\n  %2"))
def test_fast_path_agrees_with_general_path(attr_ops, text):
    """The fast path is an optimization only: same graph, or the same error, without it."""
    fast, general = _outcome(text, True), _outcome(text, False)
    if isinstance(general, str):
        assert fast == general, f"input:\n{text!r}"
    else:
        assert not isinstance(fast, str), f"{fast}\ninput:\n{text!r}"
        assert fast.diff(general) is None, f"{fast.diff(general)}\ninput:\n{text!r}"
        assert [n.text_loc for n in fast.nodes] == [n.text_loc for n in general.nodes]


@pytest.mark.parametrize("seed", SEEDS, ids=["mlp", "brief", "attrs", "constants", "placed"])
def test_every_truncation_is_clean(attr_ops, seed):
    # Exhaustive over cut points: where a file ends must never matter to the kind of error.
    for cut in range(0, len(seed), 3):
        check_text(seed[:cut])


def test_seeds_are_valid(attr_ops):
    for s in SEEDS:
        verify(parse(s))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_mutated_weights_files_load_or_raise_weights_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("w") / "w.safetensors"
    import ml_dtypes

    Weights({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([True]),
             "c": np.ones(3, ml_dtypes.bfloat16)}).save(path)
    raw = bytearray(path.read_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "header"]))
        if kind == "flip":
            raw[i] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del raw[i:i + data.draw(st.integers(1, 16))]
        elif kind == "insert":
            raw[i:i] = bytes([data.draw(st.integers(0, 255))])
        elif len(raw) > 9:
            j = data.draw(st.integers(8, min(len(raw) - 1, 120)))
            raw[j] = ord(data.draw(st.sampled_from('0123456789-[]{}",:.eE ABFIU')))
        if not raw:
            break
    path.write_bytes(bytes(raw))
    try:
        w = Weights.load(path)
    except WeightsError as e:
        assert str(e).startswith(str(path))
        return
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"{type(e).__name__}: {e} on {bytes(raw)!r}")
    for name, arr in w.items():
        assert isinstance(arr, np.ndarray)
