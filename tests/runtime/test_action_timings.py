"""A launch records when each pipeline schedule action ran on each rank
(``RunResult.action_times``, partita/runtime/action_times.py)."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.parallel.pipeline.local_unroll import action_key, schedule_actions
from partita.runtime.action_times import node_actions
from partita.runtime.parallel_run import launch


def gpt_step() -> partita.Graph:
    fwd = partita.models.gpt(2, 64, 4, 16, 128, batch=8, dtype="f32")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")


def feeds(step: partita.Graph, steps: int) -> tuple[dict, list[dict]]:
    rng = np.random.default_rng(0)
    weights = {v.name: (rng.standard_normal(v.type.shape) * 0.02).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    data = [{"ids": rng.integers(0, 128, (8, 16)).astype(np.int64),
             "target": rng.integers(0, 128, (8, 16)).astype(np.int64)} for _ in range(steps)]
    return weights, data


def schedule_order(prog, p: int) -> list[tuple[str, int, int]]:
    """The actions and transfers pp rank ``p`` runs, in the schedule's program order."""
    out: list[tuple[str, int, int]] = []
    for it in prog.schedule.program_order(tied=True)[p]:
        if getattr(it, "src", None) is not None and it.src == it.dst:
            continue
        k = action_key(it, p)
        if k not in out:
            out.append(k)
    return out


def test_every_node_of_a_rank_program_is_mapped_to_its_action():
    step = gpt_step()
    prog = partita.parallelize(step, "pp=2", "pp", microbatches=4)
    for p, g in enumerate(prog.rank_graphs()):
        table = schedule_actions(g)
        assert table is not None
        seen: list[tuple[str, int, int]] = []
        for k in node_actions(g) or []:
            if k is not None and k not in seen:
                seen.append(k)
        assert seen == schedule_order(prog, p) + [("opt", -1, -1)]
        # only the microbatch slices of the batch inputs belong to no action
        assert all(n.op == "slice" for n in g.nodes if n not in table)
    assert schedule_actions(step) is None


def test_a_pp2_launch_records_every_action_once_per_step_in_schedule_order():
    step = gpt_step()
    prog = partita.parallelize(step, "pp=2", "pp", microbatches=4)
    weights, data = feeds(step, 3)
    res = launch(prog, 2, data, weights, timeout_s=120, check=True)
    assert res.passed
    run = res.run
    assert len(run.action_times) == 2
    for r in range(2):
        want = schedule_order(prog, prog.coords(r)[0])
        per_step = run.action_times[r]
        assert per_step is not None and len(per_step) == run.steps
        for s, acts in enumerate(per_step):
            keys = [a[:3] for a in acts]
            # once per step, in the order the rank's program runs them, then the optimizer
            assert keys == want + [("opt", -1, -1)], (r, s)
            step_s = run.timings[r][s]
            for kind, mb, c, start, end in acts:
                assert 0.0 <= start <= end <= step_s, (r, s, kind, mb, c)
            # F, B, W and sends start in the schedule's order; a recv's wait ends before the
            # end of the action it feeds
            starts = [a[3] for a in acts if not a[0].startswith("recv")]
            assert starts == sorted(starts)
            at = {a[:3]: a for a in acts}
            for kind, mb, c, start, end in acts:
                if kind.startswith("recv"):
                    fed = at[("F" if kind == "recv-act" else "B", mb, c)]
                    assert end <= fed[4]
