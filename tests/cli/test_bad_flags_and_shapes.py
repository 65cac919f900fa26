"""Numeric flags out of range are usage errors (exit 2) that say the range, and a model
whose inputs cannot be made at random is an error naming the input (exit 1), never an
internal error (exit 3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import partita
from partita.cli import main

ROOT = Path(__file__).resolve().parents[2]


def call(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def write_identity(tmp_path: Path, type_text: str) -> Path:
    path = tmp_path / "m.pir"
    path.write_text(f"graph @m(%x: {type_text}) -> ({type_text}) {{\n  return %x\n}}\n")
    return path


def one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_run_input_too_large_for_memory(capsys, tmp_path, backend):
    path = write_identity(tmp_path, "f32[99999999999999]")
    rc, out, err = call(capsys, "run", path, "--backend", backend)
    assert rc == 1, err
    msg = one_line(err)
    assert msg.startswith("error: input %x is f32[99999999999999]: ") and "of memory; give it a smaller shape" in msg


def test_run_input_of_rank_over_64(capsys, tmp_path):
    dims = ",".join(["1"] * 65)
    path = write_identity(tmp_path, f"f32[{dims}]")
    rc, _, err = call(capsys, "run", path)
    assert rc == 1, err
    msg = one_line(err)
    assert msg.startswith(f"error: input %x is f32[{dims}]: NumPy cannot make random values of that shape")
    assert "at most 64 dims" in msg


def test_train_input_too_large(capsys, tmp_path):
    g = partita.parse("graph @m(%x: f32[99999999999999], %w: f32[1] param) -> (f32[]) {\n"
                      "  %y = mul(%x, %w) : f32[99999999999999]\n"
                      "  %s = sum(%y) {axes=[0]} : f32[]\n  return %s\n}\n")
    g.weights["w"] = np.ones(1, np.float32)
    path = tmp_path / "m.pir"
    partita.save(g, path)
    rc, _, err = call(capsys, "train", path, "--steps", 1, "--backend", "numpy")
    assert rc == 1, err
    assert "input %x is f32[99999999999999]: " in one_line(err)


@pytest.mark.parametrize("argv", [
    ["run", "m.pir", "--seed", "-1"],
    ["run", "m.pir", "--seed", str(2 ** 32)],
    ["demo", "--seed", "-1"],
    ["train", "m.pir", "--seed", "-5"],
    ["import", "m.onnx", "-o", "m.pir", "--seed", str(2 ** 64)],
])
def test_seed_out_of_range_is_a_usage_error(capsys, argv):
    rc, out, err = call(capsys, *argv)
    assert rc == 2
    assert "argument --seed: " in err and "seeds are 0..2**32-1" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv,said", [
    (["train", "m.pir", "--steps", "0"], "argument --steps: must be at least 1, got 0"),
    (["train", "m.pir", "--steps", "-1"], "argument --steps: must be at least 1, got -1"),
    (["train", "m.pir", "--lr", "nan"], "argument --lr: must be a finite number, got nan"),
    (["train", "m.pir", "--lr", "inf"], "argument --lr: must be a finite number, got inf"),
    (["train", "m.pir", "--lr", "0"], "argument --lr: must be more than 0, got 0"),
    (["train", "m.pir", "--lr", "-0.1"], "argument --lr: must be more than 0, got -0.1"),
    (["train", "m.pir", "--weight-decay", "-1"], "argument --weight-decay: must be at least 0, got -1"),
    (["train", "m.pir", "--momentum", "nan"], "argument --momentum: must be a finite number, got nan"),
    (["train", "m.pir", "--steps", "two"], "argument --steps: 'two' is not an integer"),
    (["run", "m.pir", "--mesh", "dp=2", "--steps", "0"], "argument --steps: must be at least 1, got 0"),
    (["run", "m.pir", "--mesh", "dp=2", "--nproc", "0"], "argument --nproc: must be at least 1, got 0"),
    (["run", "m.pir", "--mesh", "dp=2", "--lr", "nan"], "argument --lr: must be a finite number, got nan"),
    (["run", "m.pir", "--mesh", "dp=2", "--timeout", "-3"], "argument --timeout: must be more than 0, got -3"),
    (["run", "m.pir", "--mesh", "dp=2", "--timeout", "nan"], "argument --timeout: must be a finite number"),
    (["run", "m.pir", "--mesh", "dp=2", "--show-rank", "-1"], "argument --show-rank: must be at least 0, got -1"),
])
def test_numeric_flags_out_of_range_are_usage_errors(capsys, argv, said):
    rc, out, err = call(capsys, *argv)
    assert rc == 2
    assert said in err and "usage:" in err and "Traceback" not in err


def test_seed_bounds_are_accepted(capsys, tmp_path):
    path = write_identity(tmp_path, "f32[2]")
    for seed in ("0", str(2 ** 32 - 1)):
        rc, out, err = call(capsys, "run", path, "--seed", seed)
        assert rc == 0, err
        assert f"random inputs with seed {seed}" in out


def test_the_command_exits_1_for_a_huge_input(tmp_path):
    path = write_identity(tmp_path, "i64[99999999999999,99999]")
    p = subprocess.run([sys.executable, "-m", "partita", "run", str(path)], capture_output=True, text=True,
                       cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("error: input %x is i64[99999999999999,99999]: ")
