"""``partita.launch`` and ``partita run --mesh``: parallel programs on real gloo processes,
checked against the single-device graph, checkpointed, and resumed on another mesh."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import partita
from partita.runtime import LaunchError
from partita.runtime import checkpoint as ckpt
from partita.runtime.checkpoint import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


class MLP(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(12, width), nn.Linear(width, width), nn.Linear(width, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _step(width: int = 32):
    torch.manual_seed(0)
    fwd = partita.import_torch(MLP(width).eval(), (torch.randn(16, 12),))
    return fwd, partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.1, momentum=0.9)


def _batches(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((16, 12)).astype(np.float32),
             "target": rng.integers(0, 6, size=16).astype(np.int64)} for _ in range(n)]


def test_launch_checks_against_one_device_and_resumes_on_another_mesh(tmp_path):
    fwd, step = _step()
    prog = partita.parallelize(step, "dp=2", "dp")
    res = partita.launch(prog, 2, _batches(2), check=True, checkpoint_dir=str(tmp_path / "ck"), timeout_s=30)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    assert [c.step for c in res.checks] == [1, 2]
    assert res.losses() == pytest.approx([c.single_loss for c in res.checks], rel=1e-5)
    saved = ckpt.load_full(tmp_path / "ck")
    for name, a in res.weights.items():
        np.testing.assert_array_equal(saved[name], a, err_msg=name)
    # The same model on a tensor-parallel mesh starts from the recut checkpoint.
    tp = partita.parallelize(step, "tp=2", "megatron")
    again = partita.launch(tp, 2, _batches(1, seed=5), check=True, resume_from=str(tmp_path / "ck"), timeout_s=30)
    assert again.passed
    single = partita.run(step, {**saved, **_batches(1, seed=5)[0]})
    assert again.losses()[0] == pytest.approx(float(single[0]), rel=1e-5)


def test_zero3_on_processes_gathers_twice_and_matches_one_device():
    """zero3's all_gathers (the forward's and the backward's), reduce_scatters and sharded
    momentum through torch.distributed, step after step, against the single-device step."""
    _, step = _step()
    prog = partita.parallelize(step, "dp=2", "zero3")
    assert prog.plan.count("all_gather", "dp", "backward") >= 1
    res = partita.launch(prog, 2, _batches(3), check=True, timeout_s=30)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    assert [c.step for c in res.checks] == [1, 2, 3]


def test_launch_bad_input(tmp_path):
    fwd, step = _step()
    prog = partita.parallelize(step, "dp=2", "dp")
    with pytest.raises(LaunchError, match=r"nproc=3 but the program's mesh mesh\(dp=2\) has 2 ranks"):
        partita.launch(prog, 3, _batches(1))
    with pytest.raises(LaunchError, match="no inputs"):
        partita.launch(prog, 2)
    # A checkpoint of another model (other widths) is refused, naming a weight.
    _, other = _step(width=16)
    ckpt.save(tmp_path / "other", 1, ckpt.ShardLayout.of(partita.parallelize(other, "dp=2", "dp").graph),
              partita.parallelize(other, "dp=2", "dp").shard_weights())
    with pytest.raises(CheckpointError, match="fc1"):
        partita.launch(prog, 2, _batches(1), resume_from=str(tmp_path / "other"))


def test_cli_parallel_run_with_check(tmp_path):
    fwd, _ = _step()
    path = tmp_path / "mlp.pir"
    partita.save(fwd, path)
    cmd = [sys.executable, "-m", "partita", "run", str(path), "--mesh", "dp=2", "--strategy", "dp", "--train", "sgd",
           "--lr", "0.05", "--steps", "2", "--check", "--plan-json", str(tmp_path / "plan.json"), "--show-rank", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "plan: dp on mesh(dp=2)" in out.stdout
    assert "check: PASS" in out.stdout
    assert "the per-rank program (rank 1 at dp=1" in out.stdout
    assert (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("extra,message", [
    (["--strategy", "dp"], "a parallel run needs --mesh"),
    (["--mesh", "dp=2", "--nproc", "3", "--strategy", "dp", "--train", "sgd"], "nproc=3"),
    (["--mesh", "dp=2", "--strategy", "zero9", "--train", "sgd"], "unknown strategy 'zero9'"),
])
def test_cli_parallel_run_errors(tmp_path, extra, message):
    fwd, _ = _step()
    path = tmp_path / "mlp.pir"
    partita.save(fwd, path)
    out = subprocess.run([sys.executable, "-m", "partita", "run", str(path), *extra], capture_output=True, text=True,
                         timeout=240, cwd=ROOT)
    assert out.returncode != 0
    assert message in out.stderr + out.stdout
    assert "Traceback" not in out.stderr


def test_cli_under_torchrun_joins_and_checks(tmp_path):
    import socket

    fwd, _ = _step()
    path = tmp_path / "mlp.pir"
    partita.save(fwd, path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), "-m", "partita", "run", str(path), "--mesh", "dp=2", "--strategy", "dp",
           "--train", "sgd", "--lr", "0.05", "--steps", "2", "--check", "--timeout", "30",
           "--checkpoint", str(tmp_path / "ck")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("check: PASS") == 1, "rank 0 alone prints"
    assert ckpt.steps(tmp_path / "ck") == [2]
    assert set(ckpt.load_full(tmp_path / "ck")) == {v.name for v in fwd.inputs if v.role == "param"}


def test_launch_reports_a_dead_rank():
    from partita.runtime import RankFailure

    fwd, step = _step()
    prog = partita.parallelize(step, "dp=2", "dp")
    with pytest.raises(RankFailure, match="rank 1") as e:
        partita.launch(prog, 2, _batches(2), timeout_s=20, _fault=(1, 1, "exit"))
    assert "step 1" in str(e.value) or "step 2" in str(e.value)
