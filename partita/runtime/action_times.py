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

One clock for all ranks: each rank also records where each step started on the wall clock
(``time.time()``, read beside ``perf_counter`` before each step: ``ActionTimer.wall``), which
the ranks of one machine share and those of several keep close (NTP). ``align_clocks`` puts
the ranks' actions of one step on that clock, then moves a rank later where one of its recvs
would end before the matching send started (a recv cannot end before its send began), and
says by how much the wall clock was off (``Alignment.before``) and what is left after
(``Alignment.after``: nonzero only where the pairs contradict each other).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
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


def clock_anchor(samples: int = 7) -> tuple[float, float]:
    """``(wall, perf)``: ``time.time()`` and the ``perf_counter()`` reading of the same instant
    (of ``samples`` back-to-back readings, the pair read in the shortest gap)."""
    best = (math.inf, 0.0, 0.0)
    for _ in range(samples):
        a = time.perf_counter()
        w = time.time()
        b = time.perf_counter()
        if b - a < best[0]:
            best = (b - a, w, (a + b) / 2)
    return best[1], best[2]


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
        self.anchor = clock_anchor()
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
        """Forget the last step's times and read the wall clock again (call before each step)."""
        self.anchor = clock_anchor()
        nan = math.nan
        for i in range(len(self.marks)):
            self.marks[i] = nan
            self.waits[i] = nan

    def wall(self, t: float) -> float:
        """The ``perf_counter()`` reading ``t`` on the wall clock (seconds since the epoch)."""
        return self.anchor[0] + (t - self.anchor[1])

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


def carried_actions(graph: Any, actions: Sequence[ActionKey | None], rewritten: Any) -> list[ActionKey | None]:
    """Per node of ``rewritten`` (``graph`` after the code generator's passes: fused kernels,
    folded and removed nodes), the action of the node of ``graph`` it stands for: found by a
    result's name (a fused kernel's results keep the names of the values it computes, so it
    takes the action of what it hands on), a send by its tag and peer, else its operands'
    producers' last action (None: none)."""
    by_name: dict[str, ActionKey | None] = {}
    by_tag: dict[tuple, ActionKey | None] = {}
    for n, a in zip(graph.nodes, actions):
        for r in n.results:
            by_name[r.name] = a
        if not n.results:
            by_tag[(n.op, n.attrs.get("tag"), n.attrs.get("peer"))] = a
    out: list[ActionKey | None] = []
    got: dict[Any, ActionKey | None] = {}
    for n in rewritten.nodes:
        keys = [by_name[r.name] for r in n.results if r.name in by_name]
        a = keys[0] if keys else by_tag.get((n.op, n.attrs.get("tag"), n.attrs.get("peer")))
        if a is None:
            prods = [got[v.producer] for v in n.operands if v.producer is not None and got.get(v.producer) is not None]
            a = prods[-1] if prods else None
        got[n] = a
        out.append(a)
    return out


def action_timer(program: Any, graph: Any, actions: Sequence[ActionKey | None] | None) -> ActionTimer | None:
    """An ``ActionTimer`` on ``program`` (made from ``graph``, with the per-node ``actions``),
    or None when there is nothing to time: no actions, or no step of ``program`` is one of
    the graph's nodes (a rewritten graph's program: time it with ``carried_actions``)."""
    if not actions or len(actions) != len(graph):
        return None
    timer = ActionTimer(program, graph, actions)
    return timer if timer.keys else None


Pair = tuple[int, ActionKey, int, ActionKey]


def transfer_pairs(schedule: Any) -> list[Pair]:
    """Every point-to-point hand-over of a step of ``schedule`` as ``(src stage, send key, dst
    stage, recv key)``, the keys as each side's actions name them (``local_unroll.action_key``);
    the tied weights' exchange and a stage's hand-over to itself are left out."""
    from ..parallel.pipeline.local_unroll import action_key

    out: list[Pair] = []
    for t in schedule.transfers(True):
        if t.what == "tied" or t.after is None or t.src == t.dst:
            continue
        out.append((t.src, action_key(t, t.src), t.dst, action_key(t, t.dst)))
    return out


@dataclass
class Alignment:
    """Ranks' actions of one step on one clock: ``offset[rank]``, seconds from the earliest
    step start to that rank's; ``before``: the largest amount by which a recv ended before its
    send started with the wall clock alone, ``after``: the same after the moves (0.0 unless
    the pairs contradict each other); ``pairs``: the send/recv pairs found, ``moved``: the
    ranks moved later by the pairs."""

    offset: dict[int, float]
    before: float
    after: float
    pairs: list[tuple[int, int, int, int]] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)


def _violation(off: dict[int, float], cons: list[tuple[int, int, float]]) -> float:
    """The largest ``off[src] - off[dst] + lag`` over the constraints (0.0 when all hold)."""
    return max([0.0] + [off[a] + lag - off[b] for a, b, lag in cons])


def align_clocks(starts: dict[int, float], acts: dict[int, Sequence[ActionTime]],
                 pairs: Sequence[tuple[int, ActionKey, int, ActionKey]]) -> Alignment:
    """One step of several ranks on one clock: ``starts[rank]``, the step's start on the wall
    clock (``ActionTimer.wall``); ``acts[rank]``, its actions (seconds from its own start);
    ``pairs``: ``(src rank, send key, dst rank, recv key)``. Offsets from the wall clock, then
    each recv that would end before its send started moves its rank later by the gap (to a
    fixed point, as many rounds as ranks); ``Alignment.pairs`` holds the matched pairs as
    ``(src rank, index of the send in acts[src], dst rank, index of the recv in acts[dst])``."""
    t0 = min(starts.values())
    off = {r: starts[r] - t0 for r in starts}
    index = {r: {a[:3]: i for i, a in enumerate(acts[r])} for r in acts}
    found: list[tuple[int, int, int, int]] = []
    cons: list[tuple[int, int, float]] = []   # off[dst] - off[src] >= lag
    for src, skey, dst, rkey in pairs:
        i, j = index.get(src, {}).get(skey), index.get(dst, {}).get(rkey)
        if i is None or j is None or src not in off or dst not in off:
            continue
        found.append((src, i, dst, j))
        cons.append((src, dst, acts[src][i][3] - acts[dst][j][4]))
    before = _violation(off, cons)
    moved: set[int] = set()
    for _ in range(len(off) + 1):
        changed = False
        for a, b, lag in cons:
            if off[b] - off[a] < lag:
                off[b] = off[a] + lag
                moved.add(b)
                changed = True
        if not changed:
            break
    low = min(off.values())
    off = {r: o - low for r, o in off.items()}
    return Alignment(off, before, _violation(off, cons), found, sorted(moved))


__all__ = ["ActionKey", "ActionTime", "ActionTimer", "Alignment", "action_timer", "align_clocks", "carried_actions",
           "clock_anchor", "node_actions", "transfer_pairs"]
