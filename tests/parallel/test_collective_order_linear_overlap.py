"""A tensor-parallel linear layer's backward as the runtime runs it (``TorchProgram(overlap=True)``),
in the order order-collectives gives it (``overlap_linear_backward``): sequence parallelism's
re-gather of a layer's input is started before the input-gradient matmul and waited for at the
weight-gradient matmul, and the input gradient's reduce_scatter is in flight while the weight
gradient is computed. On gloo processes the step equals one device, and the executor's record
of issues, calls and waits shows a matmul in flight for both."""

from __future__ import annotations

import traceback

import numpy as np
import pytest
import torch

import partita
from partita.backend.torch_exec import TorchProgram
from partita.ir.graph import input_name

SEQ, BATCH, VOCAB, LAYERS = 8, 2, 64, 2


def sp_step():
    """A two-layer GPT's training step with selective recomputation and its ``megatron+sp``
    program over tp=2."""
    fwd = partita.models.gpt(layers=LAYERS, hidden=32, heads=4, seq=SEQ, vocab=VOCAB, batch=BATCH, dtype="f32",
                             attention="fused_softmax", layout="sbh")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.1, recompute="selective")
    return step, partita.parallelize(step, mesh="tp=2", strategy="megatron+sp")


def batches(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int64),
             "target": rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int64)} for _ in range(n)]


def test_the_regather_precedes_the_input_gradient_and_the_weight_gradient_meets_the_scatter():
    """Statically, in the rank program: each all_gather read only by matmuls (the re-gathered
    input, read by the weight gradients) comes before a matmul it does not feed, and each
    weight-gradient matmul that reads it sits between a reduce_scatter and that scatter's
    first reader."""
    _, prog = sp_step()
    nodes = list(prog.local.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    regathers = [n for n in nodes if n.op == "all_gather" and n.results[0].users
                 and all(u.op == "matmul" for u in n.results[0].users)
                 and all(pos[u] > pos[n] + 1 for u in n.results[0].users)]
    assert len(regathers) >= LAYERS - 1, [n.op for n in nodes]
    for g in regathers:
        first = min(pos[u] for u in g.results[0].users)
        assert any(n.op == "matmul" for n in nodes[pos[g] + 1:first]), "no matmul between the re-gather and its use"
    scatters = [n for n in nodes if n.op == "reduce_scatter" and n.results[0].users]
    overlapped = [r for r in scatters
                  if any(n.op == "matmul" for n in nodes[pos[r] + 1:min(pos[u] for u in r.results[0].users)])]
    assert len(overlapped) >= LAYERS, "the input gradients' reduce_scatters have no weight gradient to overlap"


@pytest.mark.timeout(180)
def test_megatron_sp_overlapped_on_gloo_equals_one_device():
    """Two steps' outputs (the loss and the updated params) against the single-device step."""
    step, prog = sp_step()
    rng = np.random.default_rng(1)
    weights = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(v.type.dtype.np)
               for v in step.inputs if v.role == "param"}
    res = partita.launch(prog, 2, batches(2), weights=weights, check=True, timeout_s=90)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    assert res.losses() == pytest.approx([c.single_loss for c in res.checks], rel=1e-5)


def _recording_worker(rank: int, port: int, results) -> None:
    """One gloo rank: the tp=2 step through ``TorchProgram(overlap=True)``, each step wrapped to
    record its call, and for a collective in flight its issue and its wait, in order."""
    try:
        import torch.distributed as dist

        from partita.parallel import comm

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        _, prog = sp_step()
        tp = TorchProgram(prog.local, donate=False, overlap=True)
        from gloo_ranks import record_overlap

        log = record_overlap(tp)
        data = batches(1)[0]
        weights = {input_name(v): torch.full(v.type.shape, 0.01) for v in prog.local.inputs
                   if v.role != "input" and v.type.dtype.name == "f32"}
        # The rank's own rows of the batch where its inputs are split, else the whole batch.
        inputs = {input_name(v): torch.as_tensor(data[input_name(v)]).reshape(-1)[:v.type.numel].reshape(v.type.shape)
                  for v in prog.local.inputs if v.role == "input"}
        with comm.use_groups(comm.new_mesh_groups(prog.mesh)):
            tp(inputs, {k: t for k, t in weights.items() if k not in inputs})
        dist.destroy_process_group()
        results.put((rank, [repr(e) for e in log] if rank == 0 else []))
    except BaseException:  # the parent must hear of any failure rather than wait for it
        results.put((rank, ["FAIL " + traceback.format_exc()]))


@pytest.mark.timeout(180)
def test_the_executor_runs_a_matmul_while_the_regather_and_the_scatter_are_in_flight():
    """The executor's record on gloo: every all_gather and reduce_scatter is started
    asynchronously and waited for later; each layer's re-gather has the input-gradient matmul
    between its start and its wait, and at least one reduce_scatter per layer has a weight
    gradient's matmul between its start and its wait."""
    from gloo_ranks import run_on_gloo_ranks

    got = run_on_gloo_ranks(_recording_worker, timeout=120)
    assert sorted(got) == [0, 1], f"ranks that reported: {sorted(got)}"
    assert not any(m.startswith("FAIL") for r in got for m in got[r]), got
    log = [eval(m) for m in got[0]]  # noqa: S307 (tuples of our own repr)
    issued = {i: k for k, (what, i, _) in enumerate(log) if what == "issue"}
    waited = {i: k for k, (what, i, _) in enumerate(log) if what == "wait"}
    ops = {i: op for _, i, op in log}
    assert set(waited) == set(issued), "a collective in flight was never waited for"
    assert all(waited[i] > issued[i] for i in issued)

    def matmuls_between(i: int) -> int:
        return sum(1 for what, _, op in log[issued[i]:waited[i]] if what == "call" and op == "matmul")
    gathers = [i for i in issued if ops[i] == "all_gather" and matmuls_between(i) > 0]
    scatters = [i for i in issued if ops[i] == "reduce_scatter" and matmuls_between(i) > 0]
    assert len(gathers) >= LAYERS - 1, [(i, ops[i], matmuls_between(i)) for i in issued]
    assert len(scatters) >= LAYERS, [(i, ops[i], matmuls_between(i)) for i in issued]
