"""When each pipeline schedule action ran on a rank: a timestamp at the first and the last
step of each action, not one per node.

A pp rank's unrolled program knows which action each of its nodes was copied for
(``partita.parallel.pipeline.local_unroll.schedule_actions``). The parent sends that, per
node in program order (``node_actions``), with the rank's program text; the rank wraps the
first and the last step of each action of its ``TorchProgram`` so that they write
``time.perf_counter()`` into a flat list (``ActionTimer``). A recv's entry is its wait: from
when the rank began waiting for the data (an asynchronous recv is waited for where its
result is first read) to when it was there; a send's is its start. Each step then yields
``[(kind, mb, chunk, start, end), ...]`` in the program's order, seconds from the step's
start. The cost is two wrapped steps per action (two ``perf_counter`` calls and a Python
call each): docs/view.md has the figure.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence, cast

ActionKey = tuple[str, int, int]
ActionTime = tuple[str, int, int, float, float]


def node_actions(graph: Any) -> list[ActionKey | None] | None:
    """Per node of ``graph`` in program order, the schedule action it was made for (None:
    none); None for a graph that is not an unrolled pp rank program."""
    from ..parallel.pipeline.local_unroll import schedule_actions

    table = schedule_actions(graph)
    if not table:
        return None
    return [table.get(n) for n in graph.nodes]


class _WaitMark:
    """Stands for a recv's ``Pending.waited`` one-element list: the seconds added to it go
    on to ``inner`` (the rank's recv seconds) and mark the wait's interval on the timer."""

    __slots__ = ("inner", "timer", "a")

    def __init__(self, inner: Any, timer: "ActionTimer", a: int) -> None:
        self.inner, self.timer, self.a = inner, timer, a

    def __getitem__(self, i: int) -> float:
        return 0.0

    def __setitem__(self, i: int, seconds: float) -> None:
        now = time.perf_counter()
        if self.inner is not None:
            self.inner[0] += seconds
        self.timer.waited(self.a, now - seconds, now)


class ActionTimer:
    """Times each schedule action of a rank's program (see the module's docstring)."""

    def __init__(self, program: Any, graph: Any, actions: Sequence[ActionKey | None]) -> None:
        from ..ops.collective import is_point_to_point

        index = {n: i for i, n in enumerate(graph.nodes)}
        self.keys: list[ActionKey] = []
        slot: dict[ActionKey, int] = {}
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        recvs: list[tuple[int, int]] = []
        for k, st in enumerate(program.steps):
            i = index.get(st[-1])
            key = actions[i] if i is not None else None
            if key is None:
                continue
            a = slot.setdefault(key, len(self.keys))
            if a == len(self.keys):
                self.keys.append(key)
            first.setdefault(a, k)
            last[a] = k
            if key[0].startswith("recv") and is_point_to_point(st[-1]) and not st[-1].operands:
                recvs.append((k, a))
        n = len(self.keys)
        self.marks = [math.nan] * (2 * n)   # start and end of each action's steps
        self.waits = [math.nan] * (2 * n)   # a recv action's wait
        self.recv_actions = {a for _, a in recvs}
        wrap: dict[int, tuple[int | None, int | None]] = {}
        for a in range(n):
            if a in self.recv_actions:
                continue
            s, e = wrap.get(first[a], (None, None))
            wrap[first[a]] = (a, e)
            s, e = wrap.get(last[a], (None, None))
            wrap[last[a]] = (s, a)
        for k, (s, e) in wrap.items():
            st = program.steps[k]
            program.steps[k] = (self.timed(st[0], s, e), *st[1:])
        for k, a in recvs:
            st = program.steps[k]
            program.steps[k] = (self.recv(st[0], a), *st[1:])

    def timed(self, fn: Any, start: int | None, end: int | None) -> Any:
        """``fn`` marking the start of action ``start`` before it and the end of ``end`` after it."""
        marks, clock = self.marks, time.perf_counter

        def step(args: list, attrs: dict) -> Any:
            if start is not None:
                marks[2 * start] = clock()
            res = fn(args, attrs)
            if end is not None:
                marks[2 * end + 1] = clock()
            return res
        return step

    def recv(self, fn: Any, a: int) -> Any:
        """``fn`` (a recv of action ``a``) marking its posting, and its wait where it is waited for."""
        from ..ops.collective import Pending

        marks, clock = self.marks, time.perf_counter

        def step(args: list, attrs: dict) -> Any:
            t0 = clock()
            res = fn(args, attrs)
            t1 = clock()
            if math.isnan(marks[2 * a]):
                marks[2 * a] = t0
            marks[2 * a + 1] = t1
            if type(res) is Pending:
                res.waited = cast(list, _WaitMark(res.waited, self, a))
            else:  # a blocking recv: the step is the wait
                self.waited(a, t0, t1)
            return res
        return step

    def waited(self, a: int, start: float, end: float) -> None:
        """Action ``a`` waited from ``start`` to ``end`` (its waits' union is its entry)."""
        w = self.waits
        if math.isnan(w[2 * a]) or start < w[2 * a]:
            w[2 * a] = start
        if math.isnan(w[2 * a + 1]) or end > w[2 * a + 1]:
            w[2 * a + 1] = end

    def reset(self) -> None:
        """Forget the last step's times (call before each step)."""
        nan = math.nan
        for i in range(len(self.marks)):
            self.marks[i] = nan
            self.waits[i] = nan

    def collect(self, t0: float) -> list[ActionTime]:
        """The step's ``(kind, mb, chunk, start, end)`` per action in program order, in seconds
        from ``t0`` (the step's start); an action that did not run this step is left out."""
        out: list[ActionTime] = []
        for a, (kind, mb, chunk) in enumerate(self.keys):
            src = self.waits if a in self.recv_actions and not math.isnan(self.waits[2 * a]) else self.marks
            s, e = src[2 * a], src[2 * a + 1]
            if math.isnan(s) or math.isnan(e):
                continue
            out.append((kind, mb, chunk, s - t0, e - t0))
        return out


def action_timer(program: Any, graph: Any, actions: Sequence[ActionKey | None] | None) -> ActionTimer | None:
    """An ``ActionTimer`` on ``program`` (made from ``graph``, with the per-node ``actions``),
    or None when there is nothing to time: no actions, or a program whose steps are not the
    graph's nodes (the generated kernels of executor="codegen" run a rewritten graph)."""
    if not actions or len(actions) != len(graph):
        return None
    timer = ActionTimer(program, graph, actions)
    return timer if timer.keys else None


__all__ = ["ActionKey", "ActionTime", "ActionTimer", "action_timer", "node_actions"]
