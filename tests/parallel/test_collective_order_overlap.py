"""zero3's prefetch as the runtime runs it (``TorchProgram(overlap=True)``, what
``partita.launch`` runs): each param all_gather is started ``prefetch`` gathers ahead and waited
for where it is read, each gradient reduce_scatter is started where it stands and waited for at
the update; on gloo processes the step equals one device, and the executor's own record of
issues, computes and waits shows each gather in flight while the layer before it computes."""

from __future__ import annotations

import traceback

import numpy as np
import pytest
import torch
from torch import nn

import partita
from partita.backend.torch_exec import TorchProgram, async_ops
from partita.ir.graph import input_name
from partita.cluster.steps import ASYNC_OPS

WIDTH = 64
# One layer's weight and bias (64 x 64 + 64 f32 = 16.6 kB) fit a gather bucket, two do not:
# a bucket is a layer, as FSDP's unit is, and prefetch=1 is one layer ahead.
GATHER_MB = 0.02
BUCKET_MB = 0.02


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        return self.head(torch.relu(self.fc3(torch.relu(self.fc2(h)))))


def zero3_step(prefetch: int = 1):
    """The single-device training step and its zero3 program over dp=2."""
    torch.manual_seed(0)
    fwd = partita.import_torch(MLP().eval(), (torch.randn(16, 12),))
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.1, momentum=0.9)
    prog = partita.parallelize(step, "dp=2", "zero3", prefetch=prefetch, gather_mb=GATHER_MB,
                               bucket_mb=BUCKET_MB, first_bucket_mb=BUCKET_MB)
    return step, prog


def batches(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((16, 12)).astype(np.float32),
             "target": rng.integers(0, 6, size=16).astype(np.int64)} for _ in range(n)]


def test_the_simulator_overlaps_what_the_runtime_overlaps():
    assert ASYNC_OPS == async_ops()
    assert {"all_gather", "reduce_scatter", "all_reduce"} <= ASYNC_OPS


def test_zero3_default_prefetch_is_one_gather_ahead():
    _, default = zero3_step()
    _, one = zero3_step(prefetch=1)
    assert [n.op for n in default.local.nodes] == [n.op for n in one.local.nodes]


@pytest.mark.parametrize("prefetch", [1, 2])
@pytest.mark.timeout(180)
def test_zero3_prefetch_on_gloo_equals_one_device(prefetch):
    """Every step's outputs (the loss, the updated params and momentum) against the
    single-device step from the same weights (``check=True`` compares each output)."""
    step, prog = zero3_step(prefetch)
    res = partita.launch(prog, 2, batches(2), check=True, timeout_s=60)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    assert [c.step for c in res.checks] == [1, 2]
    assert res.losses() == pytest.approx([c.single_loss for c in res.checks], rel=1e-5)
    params = {v.name for v in step.inputs if v.role == "param"}
    assert params and params <= set(res.weights)


def _recording_worker(rank: int, port: int, results) -> None:
    """One gloo rank: runs the zero3 step through ``TorchProgram(overlap=True)`` with every step
    wrapped to record, in the order they happen, each call and each wait of a collective in
    flight (``Pending.result`` calls its ``finish`` once the transfer is done)."""
    try:
        import torch.distributed as dist

        from partita.parallel import comm

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        _, prog = zero3_step()
        tp = TorchProgram(prog.local, donate=False, overlap=True)
        from gloo_ranks import record_overlap

        log = record_overlap(tp)
        zeros = {input_name(v): torch.zeros(v.type.shape, dtype=torch.int64 if v.type.dtype.name == "i64"
                                            else torch.float32) for v in prog.local.inputs}
        inputs = {input_name(v): zeros[input_name(v)] for v in prog.local.inputs if v.role == "input"}
        with comm.use_groups(comm.new_mesh_groups(prog.mesh)):
            tp(inputs, {k: t for k, t in zeros.items() if k not in inputs})
        dist.destroy_process_group()
        results.put((rank, [repr(e) for e in log] if rank == 0 else []))
    except BaseException:  # the parent must hear of any failure rather than wait for it
        results.put((rank, ["FAIL " + traceback.format_exc()]))


@pytest.mark.timeout(180)
def test_zero3_gathers_are_in_flight_while_the_layer_before_computes():
    """The executor's record on gloo: every all_gather and reduce_scatter is started where it
    stands and waited for later; most param gathers (all but the first of a pass and those the
    backward issues right after a reduce_scatter) have a matmul run between their start and
    their wait, and the gradient reduce_scatter has the rest of the backward's matmuls."""
    from gloo_ranks import run_on_gloo_ranks

    got = run_on_gloo_ranks(_recording_worker, timeout=120)
    assert sorted(got) == [0, 1], f"ranks that reported: {sorted(got)}"
    assert not any(m.startswith("FAIL") for r in got for m in got[r]), got
    log = [eval(m) for m in got[0]]  # noqa: S307 (tuples of our own repr)
    issued = {i: k for k, (what, i, _) in enumerate(log) if what == "issue"}
    waited = {i: k for k, (what, i, _) in enumerate(log) if what == "wait"}
    ops = {i: op for _, i, op in log}
    called = {ops[i] for what, i, _ in log if what == "call"}
    gathers = sorted((i for i in issued if ops[i] == "all_gather"), key=issued.__getitem__)
    scatters = sorted((i for i in issued if ops[i] == "reduce_scatter"), key=issued.__getitem__)
    assert {"all_gather", "reduce_scatter"} <= called
    # Every one of them ran asynchronously: none of those calls returned a finished tensor.
    assert sum(1 for what, i, _ in log if what == "call" and ops[i] in ("all_gather", "reduce_scatter")) \
        == len(gathers) + len(scatters)
    assert len(gathers) >= 8 and scatters, (gathers, scatters)
    assert set(waited) == set(issued), "a collective in flight was never waited for"
    assert all(waited[i] > issued[i] for i in issued)

    def matmuls_between(i: int) -> int:
        return sum(1 for what, _, op in log[issued[i]:waited[i]] if what == "call" and op == "matmul")
    overlapped = [i for i in gathers if matmuls_between(i) > 0]
    assert len(overlapped) >= len(gathers) // 2, [(i, matmuls_between(i)) for i in gathers]
    assert all(matmuls_between(i) > 0 for i in scatters), [(i, matmuls_between(i)) for i in scatters]
