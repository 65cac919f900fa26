"""``partita simulate``: a model parallelized and simulated on a cluster file from the command
line (in-process through ``partita.cli.main``, tiny shapes)."""

from __future__ import annotations

import json
from pathlib import Path


from partita.cli import main

MLP = """
graph @mlp(%x: f32[8,16], %w1: f32[16,32] param, %w2: f32[32,4] param) -> (f32[8,4]) {
  %h = matmul(%x, %w1) : f32[8,32]
  %a = tanh(%h) : f32[8,32]
  %y = matmul(%a, %w2) : f32[8,4]
  return %y
}
"""


def test_a_gpt_from_its_config_simulates_with_a_trace(tmp_path: Path, capsys):
    trace = tmp_path / "t.json"
    rc = main(["simulate", "--gpt", "2,64,4,16,128,8", "--dtype", "f32", "--mesh", "pp=2,dp=2",
               "--strategy", "pp+dp", "--microbatches", "4", "--trace", str(trace)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "simulated step on selene (4 of 3072 devices" in out and "MFU" in out and "tokens/s" in out
    assert "peak" in out
    assert any(e["ph"] == "X" for e in json.loads(trace.read_text())["traceEvents"])


def test_a_pir_file_without_weights_is_made_a_training_step(tmp_path: Path, capsys):
    f = tmp_path / "mlp.pir"
    f.write_text(MLP)
    rc = main(["simulate", str(f), "--mesh", "dp=2", "--strategy", "dp", "--train", "sgd", "--cluster", "dgx-h100"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "simulated step on dgx-h100" in out and "dp" in out


def test_bad_input_is_one_clear_message(tmp_path: Path, capsys):
    assert main(["simulate", "--gpt", "2,64,4"]) == 1
    assert "give six whole numbers" in capsys.readouterr().err
    assert main(["simulate"]) == 1
    assert "either FILE.pir or --gpt" in capsys.readouterr().err
    assert main(["simulate", "--gpt", "2,64,4,16,128,8", "--cluster", "selen"]) == 1
    assert "no cluster named 'selen'" in capsys.readouterr().err
    assert main(["simulate", "--gpt", "2,64,4,16,128,8", "--mesh", "dp=16", "--strategy", "dp",
                 "--cluster", "dgx-h100", "--nodes", "1"]) == 1
    assert "needs 16 devices" in capsys.readouterr().err

