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



def _err(argv: list[str], capsys) -> tuple[int, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return rc, cap.err


GPT = ["simulate", "--gpt", "2,64,4,16,128,8", "--dtype", "f32"]


def test_the_default_strategy_comes_from_the_mesh_axes(capsys):
    # Without it, --mesh dp=2 simulated two replicas that did not split the batch (MFU halved)
    # and --mesh pp=3 on a 2-layer model "succeeded".
    assert main(GPT + ["--mesh", "dp=2"]) == 0
    out = capsys.readouterr().out
    assert "strategy dp (from the mesh axes" in out and "parallelize for mesh(dp=2) with dp" in out
    rc, err = _err(GPT + ["--mesh", "pp=3"], capsys)
    assert rc == 1 and "3 chunk(s) asked for, but @gpt.train_step has 2" in err
    rc, err = _err(GPT + ["--mesh", "rows=2"], capsys)
    assert rc == 1 and "no strategy works on the mesh axis 'rows'" in err
    assert main(GPT + ["--mesh", "dp=2", "--strategy", "none"]) == 0


def test_bad_model_arguments_are_located_errors(tmp_path: Path, capsys):
    for gpt, message in [("2,64,5,32,128,8", "--gpt '2,64,5,32,128,8': gpt: hidden=64 is not a multiple of heads=5"),
                         ("2,64,4,0,128,8", "seq must be at least 1, got 0"),
                         ("999999,999999,1,999999,9999999,99999", "beyond any model partita simulates")]:
        rc, err = _err(["simulate", "--gpt", gpt], capsys)
        assert rc == 1 and message in err, err
    rc, err = _err(GPT + ["--dtype", "i7"], capsys)
    assert rc == 1 and "model dtype 'i7'" in err
    f = tmp_path / "nothing.pir"
    f.write_text("graph @g(%x: f32[2]) -> () {\n  return\n}\n")
    rc, err = _err(["simulate", str(f)], capsys)
    assert rc == 1 and "@g returns nothing" in err


def test_numbers_that_size_the_work_are_checked_first(capsys):
    import time

    t0 = time.perf_counter()
    for extra, message in [(["--mesh", "pp=2", "--microbatches", "10000000"], "microbatches=10,000,000 does not divide"),
                           (["--mesh", "pp=2", "--schedule", "interleaved", "--virtual-stages", "1000000", "--microbatches", "2"],
                            "2000000 chunk(s) asked for (2 pp ranks x virtual_stages=1000000)"),
                           (["--mesh", "pp=99999999999999999999"], "more than the 16,777,216"),
                           (["--mesh", "dp=2", "--microbatches", "2"], "--microbatches is a pipeline flag")]:
        rc, err = _err(GPT + extra, capsys)
        assert rc == 1 and message in err, err
    assert time.perf_counter() - t0 < 60      # each was minutes or a hang; a bound against hangs, not a timing


def test_a_pipeline_is_simulated_section_by_section_unless_unrolled(capsys):
    # 256 microbatches of a 2-layer model: unrolled, the command grew with them (8,192 took 52 s).
    argv = ["simulate", "--gpt", "2,64,4,16,128,256", "--dtype", "f32", "--mesh", "pp=2", "--microbatches", "256"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "section-level program" in out and "--check-memory walks" in out
    assert main(argv[:-2] + ["--microbatches", "4", "--unroll"]) == 0
    out = capsys.readouterr().out
    assert "section-level" not in out and "memory of rank 0" in out


def test_trace_paths_are_checked_before_the_work_and_named(tmp_path: Path, capsys):
    for path, message in [("", "--trace: give a file name to write"),
                          (str(tmp_path / "missing" / "t.json"), "the folder"),
                          (str(tmp_path), "is a folder")]:
        rc, err = _err(GPT + ["--trace", path], capsys)
        assert rc == 1 and message in err, err
        assert "model @" not in capsys.readouterr().out
    if Path("/dev/full").exists():
        rc, err = _err(GPT + ["--trace", "/dev/full"], capsys)
        assert rc == 1 and "--trace /dev/full: cannot write the timeline" in err, err
