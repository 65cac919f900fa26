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


# --- argument misuse: clean errors before any process starts ------------------------------------

def test_launch_arguments_that_cannot_make_a_run():
    fwd, step = _step()
    prog = partita.parallelize(step, "dp=2", "dp")
    b = _batches(1)[0]
    with pytest.raises(LaunchError, match=r"got the graph @\S+, not a ParallelProgram; call partita.parallelize"):
        partita.launch(step, 2, [b])
    with pytest.raises(LaunchError, match=r"the program is a dict, not a ParallelProgram; call partita.parallelize"):
        partita.launch({}, 2, [b])
    with pytest.raises(LaunchError, match=r"nproc must be an int equal to the mesh size, got '2' \(a str\); the "
                                          r"program's mesh mesh\(dp=2\) has 2 ranks: pass nproc=2"):
        partita.launch(prog, "2", [b])
    for steps in (-1, 0, 1.5, True):
        with pytest.raises(LaunchError, match=f"steps must be a positive int, got {steps!r}"):
            partita.launch(prog, 2, [b, b], steps=steps)
    for t in (0, -3, "60", None):
        with pytest.raises(LaunchError, match=f"timeout_s must be a positive number of seconds, got {t!r}"):
            partita.launch(prog, 2, [b], timeout_s=t)
    with pytest.raises(LaunchError, match=r"inputs is the str 'abc'; pass a mapping"):
        partita.launch(prog, 2, "abc")
    with pytest.raises(LaunchError, match=r"inputs is an empty list"):
        partita.launch(prog, 2, [])
    with pytest.raises(LaunchError, match=r"inputs\[1\] is an int, not a mapping"):
        partita.launch(prog, 2, [b, 3])
    with pytest.raises(LaunchError, match=r"weights is a list; pass a mapping"):
        partita.launch(prog, 2, [b], weights=[1])


def test_launch_checks_input_names_and_global_shapes():
    fwd, step = _step()
    prog = partita.parallelize(step, "dp=2", "dp")
    b = _batches(1)[0]
    listing = r"the program's data inputs are %x: f32\[16,12\], %target: i64\[16\]"
    # An unknown key was ignored before; it is refused, naming it and listing the inputs.
    with pytest.raises(LaunchError, match=r"inputs\[0\] has 'y', which is not a data input of the program; " + listing):
        partita.launch(prog, 2, [dict(b, y=b["x"])])
    with pytest.raises(LaunchError, match=r"inputs lacks %target and has 'tgt', which is not a data input of the "
                                          r"program; " + listing):
        partita.launch(prog, 2, {"x": b["x"], "tgt": b["target"]})
    # Shapes and dtypes are the global ones: the advice is the global array, not a local shard.
    with pytest.raises(LaunchError, match=r"inputs\[0\]\['x'\] is f32\[32,12\] but the program's data input %x is "
                                          r"f32\[16,12\]; pass the global array \(launch cuts it per rank\)") as e:
        partita.launch(prog, 2, [dict(b, x=np.zeros((32, 12), np.float32))])
    assert "local shard" not in str(e.value)
    with pytest.raises(LaunchError, match=r"inputs\[0\]\['target'\] is i32\[16\] but the program's data input "
                                          r"%target is i64\[16\]"):
        partita.launch(prog, 2, [dict(b, target=b["target"].astype(np.int32))])
    w = {k: v for k, v in step.weights.items()}
    with pytest.raises(LaunchError, match=r"weights has 'fc9.weight', which is not a param/state of the program; "
                                          r"the program's param/states are %fc1.weight: f32\[32,12\]"):
        partita.launch(prog, 2, [b], weights=dict(w, **{"fc9.weight": w["fc1.weight"]}))
    with pytest.raises(LaunchError, match=r"weights\['fc1.weight'\] is f32\[12,32\] but the program's param/state "
                                          r"%fc1.weight is f32\[32,12\]; pass the global array"):
        partita.launch(prog, 2, [b], weights=dict(w, **{"fc1.weight": w["fc1.weight"].T.copy()}))


def test_launch_takes_torch_tensors_as_global_arrays():
    """Inputs and weights given as torch tensors pass launch's global checks (the check once
    compared torch's dtype name, float32, with partita's, f32, and refused them)."""
    from partita.runtime.parallel_run import _check_global_inputs, _check_global_weights

    fwd, step = _step()
    prog = partita.parallelize(step, "dp=2", "dp")
    b = _batches(1)[0]
    _check_global_inputs(prog, {k: torch.from_numpy(v) for k, v in b.items()}, "inputs[0]")
    _check_global_weights(prog, {k: torch.from_numpy(np.asarray(v)) for k, v in step.weights.items()})
    with pytest.raises(LaunchError, match=r"inputs\[0\]\['target'\] is i32\[16\]"):
        _check_global_inputs(prog, dict(b, target=torch.from_numpy(b["target"].astype(np.int32))), "inputs[0]")


def test_launch_resumes_into_its_own_directory_and_continues_the_step_count(tmp_path):
    """Three steps saved into D, then three more resumed from D into D: saved as step-6, with
    the losses and weights of an uninterrupted six-step run. A save that could not be
    committed (the step, or a later one, already there) is refused before training."""
    _, step = _step()
    prog = partita.parallelize(step, "dp=2", "dp")
    data = _batches(6, seed=7)
    d = str(tmp_path / "ck")
    whole = partita.launch(prog, 2, data, timeout_s=60)
    first = partita.launch(prog, 2, data[:3], timeout_s=60, checkpoint_dir=d)
    assert (first.start_step, first.checkpoint_step, ckpt.steps(d)) == (0, 3, [3])
    then = partita.launch(prog, 2, data[3:], steps=3, timeout_s=60, checkpoint_dir=d, resume_from=d, check=True)
    assert then.passed
    assert (then.start_step, then.checkpoint_step, ckpt.steps(d), ckpt.latest_step(d)) == (3, 6, [3, 6], 6)
    assert first.losses() + then.losses() == whole.losses()
    saved = ckpt.load_full(d)
    for name, a in whole.weights.items():
        np.testing.assert_array_equal(then.weights[name], a, err_msg=name)
        np.testing.assert_array_equal(saved[name], a, err_msg=name)
    # A fresh 3-step run into D would save step 3 under the later step 6: refused before any
    # process starts (no step ran), and D is unchanged.
    ran = []
    with pytest.raises(LaunchError, match=r"checkpoint_dir \S+ already holds step 6, at or after the step this run "
                                          r"would save \(3 = 0 \+ steps=3\).*resume from it"):
        partita.launch(prog, 2, data[:3], timeout_s=30, checkpoint_dir=d, progress=lambda *a: ran.append(a))
    assert ran == [] and ckpt.steps(d) == [3, 6]
    # A crash between the rename and the pointer leaves `latest` on 3 while step-6 exists:
    # resuming from D into D would save step 6 again, refused up front with the fix.
    (tmp_path / "ck" / "latest").write_text("3\n")
    with pytest.raises(LaunchError, match=r"already holds step 6.*resumes from step 3.*write 6 into"):
        partita.launch(prog, 2, data[3:], timeout_s=30, checkpoint_dir=d, resume_from=d,
                       progress=lambda *a: ran.append(a))
    assert ran == []
    (tmp_path / "file").write_text("")
    with pytest.raises(LaunchError, match=r"checkpoint_dir \S+file is a file, not a directory"):
        partita.launch(prog, 2, data[:1], checkpoint_dir=str(tmp_path / "file"), progress=lambda *a: ran.append(a))
    assert ran == []


# --- the main module: what spawn can re-import ----------------------------------------------------

SCRIPT = '''import numpy as np
import partita
g = partita.parse("""graph @wide(%x: f32[8,16], %w: f32[16,2048] param) -> (f32[8,2048]) {
  %y = matmul(%x, %w) : f32[8,2048]
  return %y
}""")
g.weights["w"] = np.ones((16, 2048), np.float32)  # 128 KiB: more than a pipe holds
prog = partita.parallelize(g, "dp=2", "dp")
res = partita.launch(prog, 2, {"x": np.ones((8, 16), np.float32)}, timeout_s=20)
print("OK", float(res.outputs[0][0][0, 0]))
'''


def _python(args, tmp_path, stdin=None):
    import os
    import time

    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    t = time.monotonic()
    out = subprocess.run([sys.executable, *args], stdin=stdin, capture_output=True, text=True, timeout=180,
                         cwd=tmp_path, env=env)
    return out, time.monotonic() - t


def test_launch_from_a_script_on_standard_input_is_refused_up_front(tmp_path):
    # `python - < train.py` used to sit forever in spawn: each rank re-runs the main module's
    # file ('<stdin>'), dies, and the parent blocked writing the job to it.
    (tmp_path / "train.py").write_text(SCRIPT)
    with open(tmp_path / "train.py") as f:
        out, secs = _python(["-"], tmp_path, stdin=f)
    assert out.returncode != 0
    assert ("LaunchError: launch: the main module is a script read from standard input ('<stdin>')"
            in out.stderr), out.stderr[-3000:]
    assert "save the script to a file" in out.stderr
    assert secs < 120


def test_launch_from_python_c_works(tmp_path):
    # `python -c` has no main file to re-run: spawn works, and launch does not refuse it.
    out, _ = _python(["-c", SCRIPT], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK 16.0" in out.stdout


def test_a_script_without_a_main_guard_fails_instead_of_hanging(tmp_path):
    # Each spawned rank re-runs the unguarded script, whose launch fails inside the rank
    # before it read its job; the job (over a pipe's capacity) used to block the parent.
    (tmp_path / "train.py").write_text(SCRIPT)
    out, secs = _python(["train.py"], tmp_path)
    assert out.returncode != 0
    assert "RankFailure: rank " in out.stderr, out.stderr[-3000:]
    assert "before it received its job" in out.stderr and "if __name__ == \"__main__\":" in out.stderr
    assert secs < 120


def test_check_raise_raises_on_a_mismatch_and_check_true_only_records(monkeypatch):
    from partita.runtime import parallel_run
    from partita.runtime.parallel_run import CheckMismatch, StepCheck

    _, step = _step()
    prog = partita.parallelize(step, "dp=2", "dp")
    with pytest.raises(LaunchError, match=r"check must be False, True .* or 'raise'.*got 'yes'"):
        partita.launch(prog, 2, _batches(1), check="yes")
    # A planted disagreement (the real ones are what the check exists for): recorded by
    # check=True, raised by check="raise" with the step and the output.
    monkeypatch.setattr(parallel_run, "check_single_device",
                        lambda *a: [StepCheck(1, 0.0, "loss", 1.0, 1.0), StepCheck(2, 0.5, "w1.1", 1.0, 1.0)])
    res = partita.launch(prog, 2, _batches(2), check=True, timeout_s=30)
    assert res.passed is False
    with pytest.raises(CheckMismatch, match=r"step 2: %w1.1 differs from the single-device step by 0.5") as e:
        partita.launch(prog, 2, _batches(2), check="raise", timeout_s=30)
    assert e.value.result.checks[1].worst == 0.5
