"""The ranks' schedule actions on one clock: every recv ends after its send started, on gloo
with 2 and 4 pp ranks (1F1B and interleaved), and the alignment itself on made-up times."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.runtime.action_times import align_clocks, transfer_pairs
from partita.runtime.parallel_run import launch


def run_pp(stages: int, schedule: str, virtual: int):
    """A small GPT training step on ``stages`` gloo pp ranks, two steps."""
    fwd = partita.models.gpt(stages * virtual, 32, 2, 8, 64, batch=4, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    prog = partita.parallelize(step, f"pp={stages}", "pp", microbatches=4, schedule=schedule,
                               virtual_stages=virtual)
    rng = np.random.default_rng(0)
    weights = {v.name: (rng.standard_normal(v.type.shape) * 0.02).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    data = [{"ids": rng.integers(0, 64, (4, 8)).astype(np.int64),
             "target": rng.integers(0, 64, (4, 8)).astype(np.int64)} for _ in range(2)]
    return prog, launch(prog, stages, data, weights, timeout_s=180)


@pytest.mark.parametrize("stages, schedule, virtual", [(2, "1f1b", 1), (4, "1f1b", 1), (4, "interleaved", 2)])
def test_every_recv_ends_after_its_send_started_on_the_common_clock(stages, schedule, virtual):
    prog, res = run_pp(stages, schedule, virtual)
    run = res.run
    assert len(run.step_clock) == stages and all(c is not None and len(c) == run.steps for c in run.step_clock)
    pairs = transfer_pairs(prog.schedule)
    # every hand-over of the schedule: activations forward, gradients back
    assert len(pairs) == 2 * 4 * (stages * virtual - 1)
    ranks = {prog.coords(r)[0]: r for r in range(stages)}
    for s in range(run.steps):
        al = align_clocks({r: run.step_clock[r][s] for r in ranks.values()},
                          {r: run.action_times[r][s] for r in ranks.values()},
                          [(ranks[a], sk, ranks[b], rk) for a, sk, b, rk in pairs])
        assert len(al.pairs) == len(pairs), s   # each send found beside its recv
        assert al.after == 0.0 and min(al.offset.values()) == 0.0
        for src, i, dst, j in al.pairs:
            send, recv = run.action_times[src][s][i], run.action_times[dst][s][j]
            assert send[0].startswith("send-") and recv[0] == "recv-" + send[0][5:]
            assert al.offset[dst] + recv[4] >= al.offset[src] + send[3] - 1e-12, (s, send, recv)


def test_a_recv_ending_before_its_send_moves_its_rank_later():
    send = ("send-act", 0, 0, 0.004, 0.004)
    recv = ("recv-act", 0, 1, 0.001, 0.002)
    back = ("send-grad", 0, 1, 0.009, 0.009)
    got = ("recv-grad", 0, 0, 0.005, 0.0125)
    pairs = [(0, send[:3], 1, recv[:3]), (1, back[:3], 0, got[:3])]
    # rank 1's wall clock 1 ms early: its recv would end 1 ms before rank 0's send started
    al = align_clocks({0: 100.0, 1: 100.001}, {0: [send, got], 1: [recv, back]}, pairs)
    assert al.before == pytest.approx(0.001) and al.after == 0.0 and al.moved == [1]
    assert al.offset == {0: 0.0, 1: pytest.approx(0.002)}
    # contradicting pairs (the grad's recv ends before its send on any alignment) stay reported
    late = ("send-grad", 0, 1, 0.020, 0.020)
    al = align_clocks({0: 100.0, 1: 100.0}, {0: [send, got], 1: [recv, late]}, [(0, send[:3], 1, recv[:3]),
                                                                               (1, late[:3], 0, got[:3])])
    assert al.after > 0.0


def test_the_codegen_executors_ranks_record_every_action_too():
    fwd = partita.models.gpt(2, 32, 2, 8, 64, batch=4, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    prog = partita.parallelize(step, "pp=2", "pp", microbatches=4)
    rng = np.random.default_rng(0)
    weights = {v.name: (rng.standard_normal(v.type.shape) * 0.02).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    data = [{"ids": rng.integers(0, 64, (4, 8)).astype(np.int64),
             "target": rng.integers(0, 64, (4, 8)).astype(np.int64)} for _ in range(2)]
    res = launch(prog, 2, data, weights, timeout_s=180, executor="codegen", check=True)
    assert res.passed
    run = res.run
    pairs = transfer_pairs(prog.schedule)
    for r in range(2):
        p = prog.coords(r)[0]
        want = [a for a in prog.schedule.actions[p]]
        for s in range(run.steps):
            acts = run.action_times[r][s]
            assert [k + str(mb) for k, mb, *_ in acts if k in "FBW"] == [a.kind + str(a.mb) for a in want]
            assert {a[:3] for a in acts if a[0].startswith(("send", "recv"))} == \
                {sk for a, sk, b, rk in pairs if a == p} | {rk for a, sk, b, rk in pairs if b == p}
            assert all(0.0 <= a[3] <= a[4] <= run.timings[r][s] for a in acts)
    for s in range(run.steps):
        al = align_clocks({r: run.step_clock[r][s] for r in range(2)}, {r: run.action_times[r][s] for r in range(2)},
                          pairs)
        assert len(al.pairs) == len(pairs) and al.after == 0.0
