"""The pipeline bubble as a run measured it, beside the predicted one.

A launch (``partita.launch`` / ``partita run --mesh pp=...``) records per rank and step the
seconds the step took (``RunResult.timings``), the seconds spent inside point-to-point recvs
(``RunResult.recv_seconds``: a stage waiting for its neighbours) and when each schedule
action ran (``RunResult.action_times``: F, B, W, the sends and the recvs' waits, seconds
from each rank's own step start) with where each step started on the wall clock
(``RunResult.step_clock``). The
measured side is one bar per pp rank, its busy time and its time waiting, averaged over the
ranks of the stage and over the steps after the first (which also pays for warm-up), as
``PipelineReport.record_measured`` averages them; and under each pp rank's predicted bars,
its actions as one rank of the stage ran them in one step: the step after the first whose
time is the median; the ranks' rows on one clock (``action_times.align_clocks``: the wall
clock, then a rank moved later where a recv would end before its send started), each send
joined by a line to the recv that waits for it.
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
    out: dict[str, Any] = {"per_rank": per, "bubble": bubble, "span": sum(span[s] for s in steps) / len(steps),
                           "steps": run.steps}
    actions = actions_json(prog, run, steps, span)
    if actions is not None:
        out["actions"] = actions
    return out


def actions_json(prog: Any, run: Any, steps: list[int], span: list[float]) -> dict[str, Any] | None:
    """Per pp rank, its schedule actions as the first rank of its stage ran them in one step
    (of ``steps``, the one whose slowest-rank time ``span`` is the median), as bars
    ``[kind, mb, chunk, start, end]`` in seconds from that rank's step start, with the rank's
    ``offset`` on the common clock; ``links``: ``[src row, send bar, dst row, recv bar]``;
    ``clock``: how the clocks were aligned. None when the run recorded no action times."""
    acts = getattr(run, "action_times", None) or []
    have = [r for r in run.ranks if r < len(acts) and acts[r] is not None]
    if not have or not steps:
        return None
    s = sorted(steps, key=lambda k: span[k])[len(steps) // 2]
    rows: list[dict[str, Any]] = []
    for p in range(getattr(prog.schedule, "stages", 1)):
        rs = [r for r in have if prog.coords(r)[0] == p]
        if not rs:
            rows.append({"rank": None, "bars": []})
            continue
        r = rs[0]
        rows.append({"rank": r, "step_s": run.timings[r][s],
                     "bars": [[k, mb, c, round(a, 7), round(b, 7)] for k, mb, c, a, b in acts[r][s]]})
    out: dict[str, Any] = {"step": s, "span": span[s], "rows": rows}
    out.update(one_clock(prog, run, rows, s))
    return out


def one_clock(prog: Any, run: Any, rows: list[dict[str, Any]], s: int) -> dict[str, Any]:
    """Each row's ``offset`` (set on ``rows``) on the common clock of step ``s``, the send/recv
    ``links`` between rows and the ``clock`` summary (``common_span``: first start to last end;
    ``before``/``after``: the largest send-after-recv violation with the wall clock alone and
    after the alignment); no keys when the run recorded no step clocks."""
    from ..runtime.action_times import align_clocks, transfer_pairs

    clocks = getattr(run, "step_clock", None) or []
    have = [R["rank"] for R in rows if R["rank"] is not None and R["rank"] < len(clocks)
            and clocks[R["rank"]] is not None]
    if not have or len(have) < len([R for R in rows if R["rank"] is not None]):
        return {}
    row_of = {R["rank"]: p for p, R in enumerate(rows) if R["rank"] is not None}
    rank_of = {p: R["rank"] for p, R in enumerate(rows)}
    pairs = [(rank_of[a], sk, rank_of[b], rk) for a, sk, b, rk in transfer_pairs(prog.schedule)
             if rank_of.get(a) is not None and rank_of.get(b) is not None]
    al = align_clocks({r: clocks[r][s] for r in have}, {r: run.action_times[r][s] for r in have}, pairs)
    for R in rows:
        if R["rank"] is not None:
            R["offset"] = round(al.offset[R["rank"]], 7)
    common = max(al.offset[r] + run.timings[r][s] for r in have)
    links = [[row_of[a], i, row_of[b], j] for a, i, b, j in al.pairs]
    return {"links": links, "clock": {"common_span": common, "before": al.before, "after": al.after,
                                      "moved": al.moved, "pairs": len(links)}}


__all__ = ["actions_json", "measured_json", "one_clock"]
