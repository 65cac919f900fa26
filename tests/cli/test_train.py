"""``partita train``: a forward graph trained for a few steps from the command line.

The model is a tiny MLP written as ``.pir`` text with its weights beside it (``partita.save``),
including a ``state`` buffer that training must carry through unchanged. Runs are in-process
through ``partita.cli.main`` and kept to a few steps of tiny shapes.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import partita
from partita.cli import main

MLP = """
graph @mlp(%x: f32[8,5], %w1: f32[5,16] param, %b1: f32[16] param, %scale: f32[16] state,
           %w2: f32[16,3] param, %b2: f32[3] param) -> (f32[8,3]) {
  %0 = matmul(%x, %w1) : f32[8,16] loc("model.py":10)
  %1 = add(%0, %b1) : f32[8,16] loc("model.py":10)
  %2 = tanh(%1) : f32[8,16] loc("model.py":11)
  %h = mul(%2, %scale) : f32[8,16] loc("model.py":12)
  %3 = matmul(%h, %w2) : f32[8,3] loc("model.py":13)
  %y = add(%3, %b2) : f32[8,3] loc("model.py":13)
  return %y
}
"""
PARAMS = ("w1", "b1", "w2", "b2")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    g = partita.parse(MLP, "mlp.pir")
    rng = np.random.default_rng(0)
    for v in g.inputs:
        if v.role == "param":
            g.weights[v.name] = (0.5 * rng.standard_normal(v.type.shape)).astype(np.float32)
    g.weights["scale"] = np.linspace(0.5, 1.5, 16, dtype=np.float32)
    path = tmp_path / "mlp.pir"
    partita.save(g, path)
    return path


def call(capsys, *argv) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def losses(out: str) -> list[float]:
    return [float(m) for m in re.findall(r"^step +\d+/\d+ .* loss (\S+)", out, re.M)]


def test_train_same_batch_loss_decreases_and_saves(capsys, model):
    rc, out, err = call(capsys, "train", model, "--steps", 3, "--same-batch", "--lr", "0.05",
                        "--backend", "numpy")
    assert rc == 0, err
    ls = losses(out)
    assert len(ls) == 3
    assert ls[2] < ls[1] < ls[0]
    assert "4 parameter tensors" in out and "cross_entropy" in out and "adamw" in out
    assert "kept for backward" in out
    saved = model.with_suffix(".trained.safetensors")
    assert f"to {saved}" in out
    trained = partita.Weights.load(saved)
    initial = partita.load(model).weights
    assert sorted(trained) == sorted(initial)
    for name in PARAMS:
        assert trained[name].shape == initial[name].shape
        assert not np.array_equal(trained[name], initial[name]), name
    # A buffer is not a parameter: it is written back as it was.
    np.testing.assert_array_equal(trained["scale"], initial["scale"])
    # No optimizer state leaks into the model's weights.
    assert not any("exp_avg" in n or n == "step" for n in trained)


def test_train_sgd_momentum_with_output_path(capsys, model, tmp_path):
    out_path = tmp_path / "sgd.safetensors"
    rc, out, err = call(capsys, "train", model, "--optimizer", "sgd", "--momentum", "0.9", "--lr", "0.05",
                        "--steps", 3, "--same-batch", "-o", out_path)
    assert rc == 0, err
    assert "sgd lr=0.05, weight_decay=0, momentum=0.9" in out
    ls = losses(out)
    assert len(ls) == 3 and ls[-1] < ls[0]
    trained = partita.Weights.load(out_path)
    initial = partita.load(model).weights
    for name in PARAMS:
        assert not np.array_equal(trained[name], initial[name]), name
    assert not model.with_suffix(".trained.safetensors").exists()


def test_train_save_step_writes_a_parseable_graph(capsys, model, tmp_path):
    step_path = tmp_path / "step.pir"
    rc, out, err = call(capsys, "train", model, "--steps", 1, "--save-step", step_path)
    assert rc == 0, err
    step = partita.load(step_path)
    partita.verify(step)
    assert step.name == "mlp.train_step"
    roles = {v.name: v.role for v in step.inputs}
    assert roles["target"] == "input" and roles["scale"] == "state"
    assert all(roles[p] == "param" for p in PARAMS)
    aliased = {a.name for a in step.output_aliases if a is not None}
    assert set(PARAMS) <= aliased and "scale" not in aliased
    assert "step" in step.weights and "w1.exp_avg" in step.weights
    # The saved step runs like any graph.
    rng = np.random.default_rng(1)
    feed = {"x": rng.standard_normal((8, 5)).astype(np.float32), "target": np.array([0, 1, 2, 0, 1, 2, 0, 1])}
    outs = partita.run(step, feed)
    assert np.isfinite(outs[0]) and outs[0].shape == ()


def test_train_recompute(capsys, model):
    rc, out, err = call(capsys, "train", model, "--steps", 2, "--same-batch", "--recompute", "--lr", "0.05")
    assert rc == 0, err
    m = re.search(r"(\d+) values recomputed in backward", out)
    assert m is not None and int(m.group(1)) >= 1
    ls = losses(out)
    assert len(ls) == 2 and ls[1] < ls[0]


def test_train_recompute_gives_the_same_losses(capsys, model, tmp_path):
    runs = []
    for extra in ([], ["--recompute"]):
        rc, out, err = call(capsys, "train", model, "--steps", 2, "--backend", "numpy",
                            "-o", tmp_path / f"w{len(extra)}.safetensors", *extra)
        assert rc == 0, err
        runs.append(losses(out))
    assert runs[0] == runs[1]


def one_line_error(rc: int, out: str, err: str) -> str:
    assert rc == 1
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_train_zero_steps_is_a_usage_error(capsys, model):
    rc, _, err = call(capsys, "train", model, "--steps", 0)
    assert rc == 2
    assert "argument --steps: must be at least 1, got 0" in err and "Traceback" not in err


def test_train_momentum_with_adamw(capsys, model):
    msg = one_line_error(*call(capsys, "train", model, "--momentum", "0.9"))
    assert "--momentum applies to --optimizer sgd only" in msg


def test_train_file_without_weights(capsys, tmp_path):
    path = tmp_path / "bare.pir"
    path.write_text(MLP)
    msg = one_line_error(*call(capsys, "train", path, "--steps", 1))
    assert "bare.safetensors" in msg
    assert not path.with_suffix(".trained.safetensors").exists()
