"""The ``partita`` command: each subcommand's happy path, its errors and exit codes.

Most tests call ``main(argv)`` in-process and read the captured output; a few run the real
``python -m partita`` to check what a user sees (exit status, no traceback).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import partita
from partita.cli import common, main
from partita.cli import run as run_command
from partita.cli import verify as verify_command

ROOT = Path(__file__).resolve().parents[2]

SMALL = """\
// x + w, and a comparison: two outputs of different dtypes
graph @small(%x: f32[2,3], %w: f32[2,3] param) -> (f32[2,3], bool[2,3]) {
  %0 = add(%x, %w) : f32[2,3]
  %1 = greater(%0, %x) : bool[2,3]
  return %0, %1
}
"""

# A duplicated subexpression (cse) and a dead node (dce).
REDUNDANT = """\
graph @red(%x: f32[4,8], %b: f32[8] param) -> (f32[4,8]) {
  %0 = add(%x, %b) : f32[4,8]
  %1 = add(%x, %b) : f32[4,8]
  %2 = mul(%0, %1) : f32[4,8]
  %3 = tanh(%2) : f32[4,8]
  %4 = neg(%3) : f32[4,8]
  return %2
}
"""


def write_model(tmp_path: Path, text: str, name: str, weights: dict | None = None) -> Path:
    path = tmp_path / f"{name}.pir"
    path.write_text(text)
    if weights is not None:
        partita.Weights(weights).save(path.with_suffix(".safetensors"))
    return path


@pytest.fixture
def small(tmp_path: Path) -> Path:
    w = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    return write_model(tmp_path, SMALL, "small", {"w": w})


@pytest.fixture
def redundant(tmp_path: Path) -> Path:
    return write_model(tmp_path, REDUNDANT, "red", {"b": np.linspace(-1, 1, 8, dtype=np.float32)})


def call(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_clean_error(err: str) -> None:
    assert "Traceback" not in err
    assert err.strip(), "an error must say something"


# --- verify -------------------------------------------------------------------------------

def test_verify_ok(capsys, small):
    rc, out, err = call(capsys, "verify", small)
    assert rc == 0, err
    assert out == f"{small}: ok (2 nodes, 1 inputs, 1 params)\n"


def test_verify_parse_error_shows_location_and_caret(capsys, tmp_path):
    bad = write_model(tmp_path, SMALL.replace("greater(%0, %x)", "greater(%0, %q)"), "bad")
    rc, out, err = call(capsys, "verify", bad)
    assert rc == 1 and out == ""
    assert_clean_error(err)
    lines = err.splitlines()
    assert lines[0] == f"{bad}:4:20: error: use of undefined value %q"
    assert lines[1].strip() == "%1 = greater(%0, %q) : bool[2,3]"
    # The caret sits under the offending token.
    assert lines[2].index("^") == lines[1].index("%q")


def test_verify_type_error_names_node_and_shows_context(capsys, tmp_path):
    bad = write_model(tmp_path, REDUNDANT.replace("%3 = tanh(%2) : f32[4,8]", "%3 = tanh(%2) : f32[8,4]"), "bad")
    rc, _, err = call(capsys, "verify", bad)
    assert rc == 1
    assert_clean_error(err)
    assert err.startswith(f"{bad}:5:8: error: node %3 = tanh has result type(s) f32[8,4]")
    assert "> |" in err  # the node's line, marked, among its neighbours


def test_verify_rejects_weights_that_do_not_match(capsys, tmp_path):
    path = write_model(tmp_path, SMALL, "small", {"w": np.zeros((3, 2), np.float32)})
    rc, _, err = call(capsys, "verify", path)
    assert rc == 1
    assert_clean_error(err)
    assert "small.safetensors" in err and "%w" in err and "f32[3,2]" in err


def test_missing_file(capsys, tmp_path):
    rc, out, err = call(capsys, "verify", tmp_path / "nope.pir")
    assert rc == 1 and out == ""
    assert err.startswith("error: ") and "nope.pir" in err and "no such file" in err
    assert_clean_error(err)


def test_directory_instead_of_file(capsys, tmp_path):
    rc, _, err = call(capsys, "verify", tmp_path)
    assert rc == 1
    assert err.startswith("error: ") and str(tmp_path) in err
    assert_clean_error(err)


# --- run ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_run_summarizes_outputs(capsys, small, backend):
    rc, out, err = call(capsys, "run", small, "--backend", backend, "--seed", "3")
    assert rc == 0, err
    g = partita.load(small)
    inputs = common.random_inputs(g, 3)
    expected = partita.run(g, inputs)  # the reference interpreter is the oracle
    lines = out.splitlines()
    assert lines[0].startswith(f"@small on {backend}")
    row0 = next(line for line in lines if line.startswith("%0 "))
    row1 = next(line for line in lines if line.startswith("%1 "))
    assert "f32[2,3]" in row0 and "bool[2,3]" in row1
    for field in common.summary_fields(expected[0]):
        assert field in row0
    n_true = int(expected[1].sum())
    assert f"({n_true}/6 true)" in row1


def test_run_same_seed_same_output_other_seed_differs(capsys, small):
    outs = [call(capsys, "run", small, "--seed", s)[1].split("\n", 1)[1] for s in ("1", "1", "2")]
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]


def test_random_inputs_follow_the_dtypes():
    g = partita.parse("""graph @g(%a: f32[64], %i: i64[64], %m: bool[64], %h: bf16[4], %p: f32[2] param) -> (f32[64]) {
  return %a
}""")
    ins = common.random_inputs(g, 0)
    assert set(ins) == {"a", "i", "m", "h"}  # params come from the weights, not from here
    assert ins["a"].dtype == np.float32 and abs(float(ins["a"].mean())) < 0.5 and ins["a"].std() > 0.5
    assert ins["i"].dtype == np.int64 and ins["i"].min() >= 0 and ins["i"].max() < 8
    assert ins["m"].dtype == np.bool_ and 0 < ins["m"].sum() < 64
    assert ins["h"].dtype.name == "bfloat16"


def test_run_without_weights_file_names_file_and_params(capsys, tmp_path):
    path = write_model(tmp_path, SMALL, "small")
    rc, out, err = call(capsys, "run", path)
    assert rc == 1 and out == ""
    assert_clean_error(err)
    assert "small.safetensors" in err and "%w" in err and "does not exist" in err


def test_run_with_incomplete_weights(capsys, tmp_path):
    path = write_model(tmp_path, SMALL, "small", {"other": np.zeros(2, np.float32)})
    rc, _, err = call(capsys, "run", path)
    assert rc == 1
    assert "no weight for %w" in err
    assert_clean_error(err)


def test_run_graph_without_params_needs_no_weights(capsys, tmp_path):
    path = write_model(tmp_path, "graph @g(%x: f32[3]) -> (f32[3]) {\n  %0 = exp(%x) : f32[3]\n  return %0\n}\n", "g")
    rc, out, err = call(capsys, "run", path)
    assert rc == 0, err
    assert "%0" in out and "f32[3]" in out


def test_summary_counts_nan_and_inf():
    fields = common.summary_fields(np.array([1.0, np.nan, np.inf, 3.0], np.float32))
    assert fields[0] == "1" and fields[1] == "3" and fields[2] == "2"
    assert "(1 nan, 1 inf)" in fields[4]


def test_compare_tolerances_and_nan():
    a = [np.array([1.0, np.nan, np.inf], np.float32)]
    assert common.compare(a, [a[0].copy()], 1e-4, 1e-5) == (0.0, True)
    diff, ok = common.compare(a, [np.array([1.001, np.nan, np.inf], np.float32)], 1e-4, 1e-5)
    assert not ok and diff == pytest.approx(1e-3, rel=1e-3)
    assert common.compare(a, [np.array([1.0, 2.0, np.inf], np.float32)], 1e-4, 1e-5) == (float("inf"), False)
    assert common.compare([np.zeros(2)], [np.zeros(3)], 1e-4, 1e-5)[1] is False


# --- opt ------------------------------------------------------------------------------------

def test_opt_prints_optimized_ir(capsys, redundant):
    rc, out, err = call(capsys, "opt", redundant, "--passes=cse,dce")
    assert rc == 0, err
    g = partita.parse(out)
    partita.verify(g)
    assert [n.op for n in g.nodes] == ["add", "mul"]
    before = partita.load(redundant)
    g.weights = before.weights
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_array_equal(partita.run(before, [x])[0], partita.run(g, [x])[0])


def test_opt_writes_output_and_weights(capsys, redundant, tmp_path):
    out_path = tmp_path / "sub" / "opt.pir"
    out_path.parent.mkdir()
    rc, out, err = call(capsys, "opt", redundant, "--passes", "cse,dce", "-o", out_path)
    assert rc == 0, err
    assert out == ""
    assert "opt.safetensors" in err
    again = partita.load(out_path)
    assert len(again) == 2
    np.testing.assert_array_equal(again.weights["b"], partita.load(redundant).weights["b"])
    rc, out, _ = call(capsys, "verify", out_path)
    assert rc == 0 and "ok (2 nodes, 1 inputs, 1 params)" in out


def test_opt_timing_and_print_ir(capsys, redundant):
    rc, out, err = call(capsys, "opt", redundant, "--passes=cse,dce", "--timing",
                        "--print-ir-after=cse", "--print-ir-before", "dce")
    assert rc == 0, err
    assert "IR after cse" in err and "IR before dce" in err
    assert "IR after dce" not in err
    timing = err[err.index("pass"):]
    assert "cse" in timing and "dce" in timing and "total" in timing
    assert "5 -> 4" in timing and "4 -> 2" in timing  # cse merges the adds; dce drops tanh, neg
    assert out.startswith("graph @red")


def test_opt_print_ir_after_all(capsys, redundant):
    rc, _, err = call(capsys, "opt", redundant, "--passes=cse,dce", "--print-ir-after=all")
    assert rc == 0
    assert "IR after cse" in err and "IR after dce" in err


def test_opt_unknown_pass(capsys, redundant):
    rc, out, err = call(capsys, "opt", redundant, "--passes=cse,dcee")
    assert rc == 1 and out == ""
    assert_clean_error(err)
    assert "unknown pass 'dcee'" in err and "did you mean 'dce'" in err


def test_opt_unknown_pass_in_print_flag(capsys, redundant):
    rc, _, err = call(capsys, "opt", redundant, "--passes=cse", "--print-ir-after=nosuch")
    assert rc == 1
    assert "nosuch" in err
    assert_clean_error(err)


def test_opt_no_verify_skips_the_verifier(capsys, tmp_path):
    # Wrong result type: the verifier rejects it, --no-verify lets dce run anyway.
    text = REDUNDANT.replace("%4 = neg(%3) : f32[4,8]", "%4 = neg(%3) : f32[8,4]")
    path = write_model(tmp_path, text, "bad")
    rc, _, err = call(capsys, "opt", path, "--passes=dce")
    assert rc == 1 and "neg" in err
    rc, out, err = call(capsys, "opt", path, "--passes=dce", "--no-verify")
    assert rc == 0, err
    assert "neg" not in out


# --- ops --------------------------------------------------------------------------------------

def test_ops_lists_every_op(capsys):
    from partita.ops.registry import OPS

    rc, out, _ = call(capsys, "ops")
    assert rc == 0
    listed = {line.split("(", 1)[0] for line in out.splitlines() if line and not line.startswith(" ")}
    assert set(OPS) <= listed
    assert f"{len(OPS)} ops" in out
    assert "{approximate: str = \"none\"}" in out  # gelu's attribute with its default


def test_ops_one_op(capsys):
    rc, out, _ = call(capsys, "ops", "add")
    assert rc == 0
    assert out.startswith("add(lhs, rhs)")
    assert "commutative" in out and "right identity 0" in out


def test_ops_names_the_line_that_defines_the_op(capsys):
    # relu is registered by the _unary helper; the record names relu's own line, not the
    # helper's register call.
    src = Path(partita.__file__).parent / "ops" / "elementwise.py"
    line = next(i for i, text in enumerate(src.read_text().splitlines(), 1) if text.startswith('_unary("relu"'))
    rc, out, _ = call(capsys, "ops", "relu")
    assert rc == 0
    assert f"defined at partita/ops/elementwise.py:{line}" in out


def test_ops_unknown_op(capsys):
    rc, _, err = call(capsys, "ops", "ad")
    assert rc == 1
    assert "unknown op 'ad'" in err
    assert_clean_error(err)


# --- usage, internal errors, --debug ------------------------------------------------------------

@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["verify"], ["run", "x.pir", "--backend", "jax"],
                                  ["run", "x.pir", "--seed", "many"], ["opt", "x.pir", "--bogus"]])
def test_usage_errors_exit_2(capsys, argv):
    rc, out, err = call(capsys, *argv)
    assert rc == 2
    assert "usage:" in err
    assert_clean_error(err)


def test_help_exits_0(capsys):
    rc, out, _ = call(capsys, "--help")
    assert rc == 0
    for command in ("opt", "verify", "run", "demo", "ops"):
        assert command in out


def test_internal_error_exit_3_and_debug_traceback(capsys, small, monkeypatch):
    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(verify_command, "cmd_verify", broken)
    rc, _, err = call(capsys, "verify", small)
    assert rc == 3
    assert "internal error: RuntimeError: boom" in err and "--debug" in err
    assert "Traceback" not in err
    rc, _, err = call(capsys, "verify", small, "--debug")  # --debug after the command works too
    assert rc == 3
    assert "Traceback" in err and "RuntimeError: boom" in err


def test_debug_shows_traceback_for_user_errors(capsys, tmp_path):
    rc, _, err = call(capsys, "--debug", "verify", tmp_path / "nope.pir")
    assert rc == 1
    assert "Traceback" in err and "no such file" in err


def test_keyboard_interrupt_exit_1(capsys, small, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_command, "cmd_run", interrupted)
    rc, _, err = call(capsys, "run", small)
    assert rc == 1
    assert err == "error: interrupted\n"


# --- demo and the example model -----------------------------------------------------------------

def test_example_model_is_small_valid_and_reproducible(tmp_path):
    pir = common.DEMO_MODEL
    st = pir.with_suffix(".safetensors")
    assert st.stat().st_size < 200_000
    g = partita.load(pir)
    partita.verify(g)
    assert common.weight_problems(g) == []
    # The committed weights are exactly what the generator script makes.
    sys.path.insert(0, str(pir.parent))
    try:
        import make_example
    finally:
        sys.path.remove(str(pir.parent))
    make_example.write_weights(pir, tmp_path / "w.safetensors")
    assert (tmp_path / "w.safetensors").read_bytes() == st.read_bytes()


def test_demo(capsys):
    rc, out, err = call(capsys, "demo")
    assert rc == 0, err
    for section in ("IR before", "pipeline canonicalize,cse,fold-constants,dce", "IR after", "op counts",
                    "outputs on the same random inputs", "differences"):
        assert f"== {section}" in out
    before = int(out.split("== IR before (", 1)[1].split(" ", 1)[0])
    after = int(out.split("== IR after (", 1)[1].split(" ", 1)[0])
    assert after < before
    assert "DIFFER" not in out
    diffs = out.split("== differences", 1)[1].split("\n== ", 1)[0]
    assert diffs.count("agree") == 4
    # The training section: a step of the optimized graph, trained on both executors, whose
    # losses agree and fall.
    train = out.split("== training", 1)[1]
    assert "adamw_update" in train and "aliases(%" in train
    rows = [line.split() for line in train.splitlines() if line.strip()[:1].isdigit() and len(line.split()) == 3]
    losses = [(float(a), float(b)) for _, a, b in rows]
    assert len(losses) >= 3 and all(abs(a - b) <= 1e-4 * max(1.0, abs(a)) for a, b in losses)
    assert losses[-1][0] < losses[0][0]
    assert "agree on every loss" in train
    # The parallel section: a GPT-2 step on 8 processes (two 1F1B pipeline stages, each
    # dp x tp), checked against one device.
    par = out.split("== parallel", 1)[1]
    assert "plan: pp+dp+megatron on mesh(pp=2, dp=2, tp=2): 2 pipeline stage(s), 4 microbatches, schedule 1f1b" in par
    assert "stage 0: dp+megatron on mesh(dp=2, tp=2) (4 ranks)" in par
    # The odd vocabulary (as GPT-2's) is padded and split over tp; the tied embedding's
    # gradient is summed between the first and last stage.
    assert "padded from 257 to 258 along dim 0 so that 'tp' (size 2) splits it" in par
    assert "gradients summed between them: %lm.transformer.wte.weight" in par
    chart = par.split("the schedule, one row per pp rank", 1)[1]
    assert "rank 0 |F0" in chart and "rank 1 |" in chart
    assert "rank 0's program" in par and "send(" in par and "= recv(" in par
    assert "measured" in par
    assert "check: PASS" in par
    # The printed IR after optimization is itself valid and has the node count announced.
    ir_after = out.split("== IR after", 1)[1].split("\n", 1)[1].split("\n== ", 1)[0]
    g = partita.parse(ir_after)
    partita.verify(g)
    assert len(g) == after


# --- as a user runs it ----------------------------------------------------------------------

def _run_cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "partita", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120, stdin=subprocess.DEVNULL)


def test_subprocess_verify_ok_and_error(small, tmp_path):
    p = _run_cli("verify", small, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.endswith("ok (2 nodes, 1 inputs, 1 params)\n")
    bad = write_model(tmp_path, "graph @g(%x: f32[2]) -> (f32[2]) {\n  %0 = addd(%x, %x) : f32[2]\n  return %0\n}\n",
                      "bad")
    p = _run_cli("verify", bad, cwd=tmp_path)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    assert f"{bad}:2:8: error: unknown op 'addd'" in p.stderr and "^" in p.stderr


def test_subprocess_opt_unknown_pass_and_usage(redundant, tmp_path):
    p = _run_cli("opt", redundant, "--passes=nope", cwd=tmp_path)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr and "unknown pass 'nope'" in p.stderr
    p = _run_cli("opt", cwd=tmp_path)
    assert p.returncode == 2 and "usage:" in p.stderr
