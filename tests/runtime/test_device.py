"""The executor on a device other than the CPU, and the choice of process-group backend.

This machine has no GPU. What can be tested here is that a program keeps every tensor on
the device it is given: the "meta" device computes shapes only, so a tensor an op made on
the CPU instead would meet a meta tensor and fail. The CUDA tests run only where a GPU is.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import partita
from partita.backend.torch_exec import TorchProgram
from partita.runtime import LaunchError
from partita.runtime.launch import resolve_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_train import gpt2  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def _gpt2_step():
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    fwd = partita.import_torch(gpt2(1, 32, 2, 64, 16).eval(), (ids,))
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.1, momentum=0.9)
    (name,) = [v.name for v in fwd.inputs if v.role == "input"]
    feed = {k: np.asarray(v) for k, v in step.weights.items()}
    feed.update({name: ids.numpy(), "target": ids.roll(1, 1).numpy()})
    return step, feed


def test_every_tensor_stays_on_the_programs_device():
    step, feed = _gpt2_step()
    want = TorchProgram(step)(feed)
    got = TorchProgram(step, device="meta")(feed)
    assert all(o.device.type == "meta" for o in got)
    assert [tuple(o.shape) for o in got] == [tuple(o.shape) for o in want]
    assert [o.dtype for o in got] == [o.dtype for o in want]
    # An explicit CPU device is the default executor.
    for a, b in zip(TorchProgram(step, device="cpu")(feed), want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_constant_output_is_made_on_the_device():
    g = partita.parse("""graph @c(%x: f32[2]) -> (f32[2], f32[2]) {
  %0 = constant() {value=dense<f32[2], [1.0, 2.0]>} : f32[2]
  %1 = add(%x, %0) : f32[2]
  return %0, %1
}""")
    outs = TorchProgram(g, device="meta")([np.zeros(2, np.float32)])
    assert [o.device.type for o in outs] == ["meta", "meta"]


def test_backend_choice():
    assert resolve_backend("gloo", 4) == "gloo"
    gpus = torch.cuda.device_count() if HAS_CUDA else 0
    assert resolve_backend("auto", 2) == ("nccl" if gpus >= 2 and torch.distributed.is_nccl_available() else "gloo")
    with pytest.raises(LaunchError, match="unknown backend 'mpi'; choose one of auto, gloo, nccl"):
        resolve_backend("mpi", 2)


@pytest.mark.skipif(HAS_CUDA, reason="checks the error on a machine without GPUs")
def test_nccl_without_gpus_is_refused_with_the_fix():
    with pytest.raises(LaunchError, match="use backend='gloo'"):
        resolve_backend("nccl", 2)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (CI and this machine have none)")
def test_cuda_program_matches_the_cpu_program():
    step, feed = _gpt2_step()
    want = TorchProgram(step)(feed)
    got = TorchProgram(step, device="cuda")(feed)
    for a, b in zip(got, want):
        assert a.device.type == "cuda"
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HAS_CUDA or not torch.distributed.is_nccl_available(),
                    reason="needs a CUDA GPU and NCCL (CI and this machine have neither)")
@pytest.mark.timeout(180)
def test_launch_on_nccl_matches_one_device():
    step, feed = _gpt2_step()
    n = min(torch.cuda.device_count(), 2)
    prog = partita.parallelize(step, f"dp={n}", "dp")
    batch = {k: feed[k] for k in feed if k not in step.weights}
    res = partita.launch(prog, n, [batch, batch], check=True, backend="nccl", timeout_s=120)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
