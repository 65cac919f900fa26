"""The pipeline bubble as a run measured it, beside the predicted one.

A launch (``partita.launch`` / ``partita run --mesh pp=...``) records per rank and step the
seconds the step took (``RunResult.timings``) and the seconds spent inside point-to-point
recvs (``RunResult.recv_seconds``: a stage waiting for its neighbours). It does not record
when each F, B or W ran, so the measured side is one bar per pp rank: its busy time and its
time waiting, averaged over the ranks of the stage and over the steps after the first (which
also pays for warm-up), as ``PipelineReport.record_measured`` averages them.
"""

from __future__ import annotations

from typing import Any


def measured_json(prog: Any, run: Any) -> dict[str, Any] | None:
    """Per pp rank the measured step and recv seconds and the measured bubble fraction, from
    ``run`` (a LaunchResult or its RunResult) of the pipeline ``prog``; None when the run
    recorded no recv times."""
    run = getattr(run, "run", run)
    recv = getattr(run, "recv_seconds", None) or []
    timings = getattr(run, "timings", None) or []
    have = [r for r in run.ranks if r < len(recv) and recv[r] is not None and r < len(timings)
            and timings[r] is not None]
    if not have or not run.steps:
        return None
    steps = list(range(1, run.steps)) or [0]
    span = run.step_seconds()
    stages = getattr(prog.schedule, "stages", 1)
    per: list[dict[str, float]] = []
    for p in range(stages):
        rs = [r for r in have if prog.coords(r)[0] == p]
        if not rs:
            per.append({"step": 0.0, "recv": 0.0, "ranks": 0})
            continue
        step = sum(timings[r][s] for r in rs for s in steps) / (len(rs) * len(steps))
        wait = sum(recv[r][s] for r in rs for s in steps) / (len(rs) * len(steps))
        per.append({"step": step, "recv": wait, "ranks": len(rs)})
    fr = [sum(recv[r][s] for r in have) / (len(have) * span[s]) for s in steps if span[s] > 0]
    bubble = sum(fr) / len(fr) if fr else 0.0
    return {"per_rank": per, "bubble": bubble, "span": sum(span[s] for s in steps) / len(steps),
            "steps": run.steps}


__all__ = ["measured_json"]
