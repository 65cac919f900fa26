"""The pass manager: registry, pipeline parsing and its errors, instrumentation, reproducers."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Literal

import pytest

import partita
from partita.ir import Graph, PassError, TensorType, parse, print_graph
from partita.passes import PASSES, Pass, PassManager, get_pass, register_pass

SRC = """graph @f(%x: f32[4], %y: f32[4]) -> (f32[4]) {
  %one = full() {shape=[4], value=1.0} : f32[4]
  %0 = mul(%x, %one) : f32[4]
  %1 = add(%0, %y) : f32[4]
  %2 = add(%0, %y) : f32[4]
  %3 = mul(%1, %2) : f32[4]
  %dead = exp(%3) : f32[4]
  return %3
}
"""


def graph() -> Graph:
    return parse(SRC, "test.pir")


@pytest.fixture
def temp_passes():
    """Register passes for one test only; ``register(cls)`` returns the class."""
    added: list[str] = []

    def register(cls):
        register_pass(cls)
        added.append(cls.name)
        return cls

    yield register
    for name in added:
        PASSES.pop(name, None)


# --- registry ---------------------------------------------------------------------------

def test_builtin_passes_are_registered():
    for name in ("dce", "cse", "fold-constants", "canonicalize"):
        cls = get_pass(name)
        assert cls.name == name and cls.__doc__ and cls.__doc__.strip()


def test_get_pass_suggests_the_closest_name():
    with pytest.raises(PassError) as e:
        get_pass("canonicalise")
    msg = str(e.value)
    assert "unknown pass 'canonicalise'" in msg and "did you mean 'canonicalize'?" in msg
    assert "cse" in msg and "fold-constants" in msg  # the valid choices are listed


def test_register_pass_checks_names_and_options(temp_passes):
    class BadName(Pass):
        name = "Bad_Name"

    with pytest.raises(ValueError, match="kebab-case"):
        register_pass(BadName)

    class NoDefault(Pass):
        name = "test-no-default"

        @dataclass
        class Options:
            n: int

    with pytest.raises(ValueError, match="needs a default"):
        register_pass(NoDefault)

    class DupDce(Pass):
        name = "dce"

    with pytest.raises(ValueError, match="registered twice"):
        register_pass(DupDce)
    assert PASSES["dce"] is not DupDce


# --- pipeline text ----------------------------------------------------------------------

def test_parse_pipeline_with_options():
    pm = PassManager.parse(" canonicalize{fast-math=true} , cse,fold-constants{max-elements=0x10},dce ")
    assert [p.name for p in pm.passes] == ["canonicalize", "cse", "fold-constants", "dce"]
    assert pm.passes[0].options.fast_math is True
    assert pm.passes[2].options.max_elements == 16
    assert pm.pipeline_text() == "canonicalize{fast-math=true},cse,fold-constants{max-elements=16},dce"


@pytest.mark.parametrize("text", [
    "dce",
    "canonicalize,cse,dce",
    "fold-constants{max-elements=7},canonicalize{fast-math=true,trace=true}",
    "fold-constants,fold-constants{max-elements=1}",
])
def test_pipeline_text_round_trips(text):
    pm = PassManager.parse(text)
    assert pm.pipeline_text() == text
    again = PassManager.parse(pm.pipeline_text())
    assert [p.options for p in again.passes] == [p.options for p in pm.passes]


def test_default_options_are_not_printed():
    pm = PassManager.parse("fold-constants{max-elements=65536},canonicalize{fast-math=false}")
    assert pm.pipeline_text() == "fold-constants,canonicalize"


def test_string_and_choice_options(temp_passes):
    @temp_passes
    class Configured(Pass):
        """A test pass with every option type."""

        name = "test-configured"

        @dataclass
        class Options:
            mesh: str = ""
            mode: Literal["fast", "exact"] = "exact"
            scale: float = 1.0
            count: int = 3
            on: bool = False

        def run(self, graph):
            return graph

    pm = PassManager.parse("test-configured{mesh=dp:2,tp:2, mode=fast, scale=2.5e-1, on=true}")
    o = pm.passes[0].options
    assert (o.mesh, o.mode, o.scale, o.count, o.on) == ("dp:2,tp:2", "fast", 0.25, 3, True)
    text = pm.pipeline_text()
    assert text == 'test-configured{mesh="dp:2,tp:2",mode=fast,scale=0.25,on=true}'
    assert PassManager.parse(text).passes[0].options == o
    assert PassManager.parse("test-configured{mesh='a b'}").passes[0].options.mesh == "a b"
    with pytest.raises(PassError, match=r"option 'mode' of 'test-configured' must be one of fast, exact, got 'slow'"):
        PassManager.parse("test-configured{mode=slow}")
    with pytest.raises(PassError, match="must be a number, got 'x1'"):
        PassManager.parse("test-configured{scale=x1}")


@pytest.mark.parametrize("text, fragments", [
    ("canonicalize,dcee", ["column 14", "unknown pass 'dcee'", "did you mean 'dce'?", "available passes:", "fold-constants"]),
    ("cse{x=1}", ["column 5", "pass 'cse' has no option 'x'", "'cse' takes no options"]),
    ("fold-constants{max-element=4}", ["has no option 'max-element'", "did you mean 'max-elements'?",
                                       "its options are: max-elements (an integer)"]),
    ("fold-constants{max-elements=abc}", ["column 29", "option 'max-elements' of 'fold-constants' must be an integer",
                                          "got 'abc'"]),
    ("fold-constants{max-elements=1.5}", ["must be an integer, got '1.5'"]),
    ("canonicalize{fast-math=yes}", ["option 'fast-math' of 'canonicalize' must be true or false, got 'yes'"]),
    ("canonicalize{fast-math=true,fast-math=false}", ["option 'fast-math' of 'canonicalize' is given twice"]),
    ("canonicalize{fast-math}", ["expected 'option=value'", "its options are: fast-math (true or false), trace"]),
    ("dce{", ["expected '}' to close the options of 'dce'"]),
    ("dce}", ["column 4", "expected ',' between passes, found '}'"]),
    ("cse dce", ["column 5", "expected ',' between passes, found 'dce'"]),
    ("cse,,dce", ["column 5", "expected a pass name, found ','"]),
    ("cse,", ["expected a pass name, found the end of the pipeline"]),
    ("fold-constants{max-elements=}", ["expected a value for option 'max-elements'"]),
    ("", ["empty pipeline", "canonicalize,cse,dce"]),
    ("dce{a=\"x}", ["unterminated quoted string"]),
])
def test_pipeline_errors_name_the_place_and_the_choices(text, fragments):
    with pytest.raises(PassError) as e:
        PassManager.parse(text)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in:\n{msg}"


def test_pipeline_error_draws_a_caret_under_the_column():
    with pytest.raises(PassError) as e:
        PassManager.parse("cse,dcee")
    lines = str(e.value).splitlines()
    assert lines[1] == "  cse,dcee"
    assert lines[2] == "      ^"


def test_print_ir_names_must_be_passes():
    with pytest.raises(PassError, match="print_ir_after: unknown pass 'csee'.*did you mean 'cse'"):
        PassManager.parse("cse", print_ir_after=["csee"])


# --- running --------------------------------------------------------------------------------

def test_run_records_timings_and_node_counts():
    pm = PassManager.parse("canonicalize,cse,dce")
    g = pm.run(graph())
    assert [t[0] for t in pm.timings] == ["canonicalize", "cse", "dce"]
    assert [(t[2], t[3]) for t in pm.timings] == [(6, 4), (4, 3), (3, 2)]
    assert all(isinstance(t[1], float) and t[1] >= 0 for t in pm.timings)
    assert print_graph(g) == (
        "graph @f(%x: f32[4], %y: f32[4]) -> (f32[4]) {\n"
        "  %0 = add(%x, %y) : f32[4]\n"
        "  %1 = mul(%0, %0) : f32[4]\n"
        "  return %1\n"
        "}\n")


def test_timing_table_lists_each_pass_and_a_total():
    out = io.StringIO()
    pm = PassManager.parse("canonicalize,cse,dce", timing=True, out=out)
    pm.run(graph())
    table = pm.timing_table()
    assert out.getvalue() == table
    lines = table.splitlines()
    assert lines[0].split() == ["pass", "ms", "nodes", "%"]
    rows = {ln.split()[0]: ln.split() for ln in lines[1:] if not ln.startswith("-")}
    assert rows["canonicalize"][2:5] == ["6", "->", "4"]
    assert rows["dce"][2:5] == ["3", "->", "2"]
    assert rows["total"][2:5] == ["6", "->", "2"] and rows["total"][5] == "100.0"
    total_ms = sum(t[1] for t in pm.timings) * 1e3
    assert float(rows["total"][1]) == pytest.approx(total_ms, abs=2e-3)
    shares = [float(rows[n][5]) for n in ("canonicalize", "cse", "dce")]
    assert sum(shares) == pytest.approx(100.0, abs=0.2)


def test_print_ir_after_and_before():
    out = io.StringIO()
    g = graph()
    pm = PassManager.parse("cse,dce", print_ir_after=["cse"], print_ir_before=["dce"], out=out)
    pm.run(g)
    text = out.getvalue()
    head, _, rest = text.partition("\n")
    assert head == "// ----- IR after cse -----"
    after_cse, _, rest = rest.partition("// ----- IR before dce -----\n")
    assert after_cse == rest  # nothing happens between the two points
    assert "%dead" in after_cse and after_cse.count("add(") == 1
    assert parse(after_cse).diff(parse(rest)) is None


def test_print_ir_all_shows_options_in_headers():
    out = io.StringIO()
    PassManager.parse("fold-constants{max-elements=8},dce", print_ir_after="all", out=out).run(graph())
    headers = [ln for ln in out.getvalue().splitlines() if ln.startswith("// -----")]
    assert headers == ["// ----- IR after fold-constants{max-elements=8} -----", "// ----- IR after dce -----"]


def test_optimize_uses_the_manager():
    g = partita.optimize(graph(), "canonicalize,cse,dce", verify_each=True)
    assert [n.op for n in g.nodes] == ["add", "mul"]
    with pytest.raises(PassError, match="unknown pass 'nope'"):
        partita.optimize(graph(), "nope")


def test_invalid_input_graph_is_reported_before_any_pass():
    g = graph()
    next(iter(g.nodes)).results[0].type = TensorType((5,), partita.dtypes.f32)
    with pytest.raises(PassError, match="input of pipeline 'dce' is invalid IR"):
        PassManager.parse("dce").run(g)


# --- failures and reproducers -----------------------------------------------------------------

def _register_failing_passes(temp_passes):
    @temp_passes
    class BreakTypes(Pass):
        """Test pass: gives the first add a wrong result type (invalid IR)."""

        name = "test-break-types"

        def run(self, graph):
            for n in graph.nodes:
                if n.op == "add":
                    n.results[0].type = TensorType((7,), n.results[0].type.dtype)
                    break
            return graph

    @temp_passes
    class Explode(Pass):
        """Test pass: edits the graph, then raises."""

        name = "test-explode"

        @dataclass
        class Options:
            level: int = 1

        def run(self, graph):
            for n in list(graph.reversed_nodes()):
                if not any(r.has_uses for r in n.results):
                    graph.erase(n)
            raise RuntimeError(f"boom at level {self.options.level}")

    @temp_passes
    class ReturnsNone(Pass):
        name = "test-returns-none"

        def run(self, graph):
            return None


def test_verifier_failure_after_a_pass_writes_a_reproducer(temp_passes, tmp_path):
    _register_failing_passes(temp_passes)
    pm = PassManager.parse("canonicalize,test-break-types,dce", reproducer_dir=tmp_path)
    with pytest.raises(PassError) as e:
        pm.run(graph())
    msg = str(e.value)
    path = tmp_path / "partita-reproducer-test-break-types.pir"
    assert msg.startswith("pass test-break-types produced invalid IR: ")
    assert "result type(s) f32[7]" in msg
    assert f"reproducer written to {path}" in msg
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0] == "// pipeline: canonicalize,test-break-types,dce"
    assert lines[1] == "// failing pass: test-break-types"
    assert lines[2] == f"// reproduce: partita opt {path} --passes=test-break-types"
    # The IR as it was after canonicalize, before the failing pass; it parses and verifies.
    expected = PassManager.parse("canonicalize").run(graph())
    reproduced = partita.verify(parse(text, str(path)))
    assert print_graph(reproduced) == print_graph(expected)


def test_exception_in_a_pass_writes_the_ir_from_before_it(temp_passes, tmp_path):
    _register_failing_passes(temp_passes)
    pm = PassManager.parse("cse,test-explode{level=3}", reproducer_dir=tmp_path)
    with pytest.raises(PassError) as e:
        pm.run(graph())
    msg = str(e.value)
    path = tmp_path / "partita-reproducer-test-explode.pir"
    assert "pass 'test-explode{level=3}' failed: RuntimeError: boom at level 3" in msg
    assert str(path) in msg
    text = path.read_text()
    assert "// failing pass: test-explode{level=3}\n" in text
    assert "--passes='test-explode{level=3}'" in text  # quoted for the shell
    body = "".join(ln + "\n" for ln in text.splitlines() if not ln.startswith("//"))
    # The pass erased %dead before raising; the reproducer still has it.
    assert "%dead = exp" in body
    assert print_graph(parse(body)) == print_graph(PassManager.parse("cse").run(graph()))


def test_without_snapshots_the_reproducer_says_so(temp_passes, tmp_path):
    _register_failing_passes(temp_passes)
    pm = PassManager.parse("test-explode", reproducer_dir=tmp_path, snapshot=False)
    with pytest.raises(PassError):
        pm.run(graph())
    text = (tmp_path / "partita-reproducer-test-explode.pir").read_text()
    assert "snapshots were off" in text
    assert "%dead" not in text  # what the pass left, not the IR before it


def test_a_pass_must_return_a_graph(temp_passes, tmp_path):
    _register_failing_passes(temp_passes)
    with pytest.raises(PassError, match="pass 'test-returns-none' failed: TypeError: run\\(\\) returned NoneType"):
        PassManager.parse("test-returns-none", reproducer_dir=tmp_path).run(graph())


def test_reproducers_can_be_turned_off(temp_passes, tmp_path):
    _register_failing_passes(temp_passes)
    with pytest.raises(PassError) as e:
        PassManager.parse("test-explode", reproducer_dir=None).run(graph())
    assert "reproducer" not in str(e.value)


def test_no_verification_when_verify_each_is_off(temp_passes, tmp_path):
    _register_failing_passes(temp_passes)
    g = PassManager.parse("test-break-types", verify_each=False, reproducer_dir=tmp_path).run(graph())
    assert any(n.results[0].type.shape == (7,) for n in g.nodes)
    assert not list(tmp_path.iterdir())
