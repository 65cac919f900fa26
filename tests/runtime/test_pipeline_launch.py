"""Pipeline programs on real gloo processes: the steps agree with one device, the bubble is
measured, a rank that dies mid-schedule stops every rank with an error naming it and the
action, and the stages' checkpoints load onto another stage cut or mesh bit-exactly."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import partita
from partita.passes.manager import PassManager
from partita.runtime import checkpoint as ckpt
from partita.runtime.launch import RankFailure
from partita.runtime.parallel_run import launch

B, T = 8, 16


@pytest.fixture(scope="module")
def gpt2_step():
    from partita.runtime.demo import gpt2_from_config

    torch.manual_seed(0)
    model, cfg = gpt2_from_config(layers=4)
    fwd = partita.import_torch(model, (torch.randint(0, cfg.vocab_size, (B, T)),))
    fwd = PassManager.parse("split-projections").run(fwd)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.05, momentum=0.9)
    return step, cfg.vocab_size


def _data(vocab: int, n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(0, vocab, (B, T)).astype(np.int64),
             "target": rng.integers(0, vocab, (B, T)).astype(np.int64)} for _ in range(n)]


def test_pp_dp_on_gloo_agrees_with_one_device_and_measures_the_bubble(gpt2_step):
    step, vocab = gpt2_step
    prog = partita.parallelize(step, "pp=2,dp=2", "pp+dp", microbatches=4, schedule="1f1b")
    res = launch(prog, 4, _data(vocab, 3), check=True, timeout_s=60)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    assert res.losses() == pytest.approx([c.single_loss for c in res.checks], rel=1e-5)
    # Every rank waited in its recvs; the plan holds the bubble as it ran beside the prediction.
    assert all(w is not None and len(w) == 3 for w in res.run.recv_seconds)
    assert prog.plan.measured_bubble is not None and 0.0 < prog.plan.measured_bubble < 1.0
    assert "measured" in prog.plan.summary()


def test_a_rank_that_dies_mid_schedule_stops_every_rank_naming_it_and_the_action(gpt2_step):
    step, vocab = gpt2_step
    prog = partita.parallelize(step, "pp=2,dp=2", "pp+dp", microbatches=4, schedule="1f1b")
    t = time.monotonic()
    with pytest.raises(RankFailure) as info:
        launch(prog, 4, _data(vocab, 1), steps=3, timeout_s=10, _fault=(2, 1, "kill-mid"))
    assert time.monotonic() - t < 60
    msg = str(info.value)
    # The dead rank (stage 1), the step, and the schedule action it was in: a send or recv
    # of a microbatch's forward activation or backward gradient between two stages.
    assert info.value.rank == 2 and info.value.step == 1, msg
    assert msg.startswith("rank 2 (pp=1, dp=0 on mesh(pp=2, dp=2)) died at step 1"), msg
    assert "killed by signal SIGKILL in " in msg and "over axis 'pp' (" in msg, msg
    assert any(f"of {k}" in msg.split("\n")[0] for k in ("F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3")), msg
    assert "stage 1 -> stage 0" in msg or "stage 0 -> stage 1" in msg, msg
    # Its neighbour names the transfer it lost.
    assert "recv from rank 2 over axis 'pp'" in msg or "send to rank 2 over axis 'pp'" in msg, msg


def test_stage_checkpoints_load_onto_another_cut_and_mesh_bit_exactly(gpt2_step, tmp_path):
    step, vocab = gpt2_step
    data = _data(vocab, 2)
    prog = partita.parallelize(step, "pp=2,tp=2", "pp+megatron", microbatches=2)
    res = launch(prog, 4, data, check=True, checkpoint_dir=str(tmp_path / "ck"), timeout_s=60)
    assert res.passed and res.checkpoint_step == 2
    assert [d.name for d in ckpt.stage_dirs(tmp_path / "ck")] == ["stage-0", "stage-1"]
    assert ckpt.latest_step(tmp_path / "ck") == 2
    full = ckpt.load_full(tmp_path / "ck")
    assert set(full) == set(res.weights)
    for k, v in res.weights.items():
        np.testing.assert_array_equal(full[k], v, err_msg=k)
    # Another pp size, stage cut and schedule, and a mesh without pp, all start from it.
    other = partita.parallelize(step, "pp=4", "pp", microbatches=4, stages=[1, 1, 1, 1], schedule="zero-bubble")
    again = launch(other, 4, data[:1], check=True, resume_from=str(tmp_path / "ck"), timeout_s=60)
    assert again.passed and again.start_step == 2
    single = partita.run(step, {**full, **data[0]})
    assert again.losses()[0] == pytest.approx(float(single[0]), rel=1e-5)
    dp = partita.parallelize(step, "dp=2", "dp")
    third = launch(dp, 2, data[:1], check=True, resume_from=str(tmp_path / "ck"), timeout_s=60)
    assert third.passed and third.losses()[0] == pytest.approx(float(single[0]), rel=1e-5)


def test_cli_runs_a_pipeline_with_its_options_and_prints_the_schedule(gpt2_step, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from partita.runtime.demo import gpt2_from_config

    torch.manual_seed(0)
    model, cfg = gpt2_from_config(layers=4)
    fwd = partita.import_torch(model, (torch.randint(0, cfg.vocab_size, (B, T)),))
    partita.save(fwd, str(tmp_path / "gpt.pir"))
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "partita", "run", str(tmp_path / "gpt.pir"), "--mesh", "pp=2",
                          "--strategy", "pp", "--train", "sgd", "--microbatches", "4", "--schedule", "gpipe",
                          "--stages", "1,3", "--steps", "2", "--check", "--html", str(tmp_path / "pp.html")],
                         capture_output=True, text=True, env=env, timeout=240, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "2 pipeline stage(s), 4 microbatches, schedule gpipe" in text, text
    assert "cut: layers per chunk [1, 3]" in text, text
    assert "rank 0 |F0" in text and "pipeline bubble: predicted" in text, text
    assert "check: PASS" in text, text
    # --html is written after the launch: the page holds the measured bubble beside the predicted one.
    import json
    import re

    page = (tmp_path / "pp.html").read_text()
    m = re.search(r'<script type="application/json" id="pdata">(.*?)</script>', page, re.S)
    assert m, "no data in the page"
    blob = json.loads(m.group(1).replace("<\\/", "</"))
    assert blob["pipeline"]["schedule"]["measured"]["bubble"] >= 0.0


@pytest.mark.parametrize("schedule, virtual", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zero-bubble", 1)])
def test_every_schedule_on_gloo_ranks_agrees_with_one_device(gpt2_step, schedule, virtual):
    step, vocab = gpt2_step
    prog = partita.parallelize(step, "pp=2", "pp", microbatches=4, schedule=schedule, virtual_stages=virtual)
    res = launch(prog, 2, _data(vocab, 2, seed=3), check=True, timeout_s=60)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
