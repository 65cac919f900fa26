"""Pipeline schedules as data: per pp rank, the ordered list of actions it runs.

An action is the forward (``F``), the backward (``B``) or, where the schedule runs them apart,
the weight-gradient part of the backward (``W``; ``B`` is then the input-gradient part) of one
model chunk on one microbatch. Chunk ``c`` lives on pp rank ``c % S`` (``S`` ranks, ``v``
chunks per rank: ``S * v`` chunks in all; ``v = 1`` but for the interleaved schedule).

The schedules:

- ``gpipe``: every forward, then every backward (Huang et al. 2019);
- ``1f1b``: PipeDream-flush (Narayanan et al. 2021): rank ``p`` runs ``S - p - 1`` forwards,
  then alternates one forward and one backward, then drains the backwards; it holds at
  most ``S - p`` microbatches of activations where GPipe holds ``M``;
- ``interleaved``: Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, section 2.2) with
  ``v`` chunks per rank, microbatches in rounds of ``S``;
- ``zero-bubble``: ZB-H1 (Qi et al. 2023): 1F1B's order and memory bound, with each backward
  split into ``B`` and ``W`` and the ``W`` passes moved into the bubbles that 1F1B leaves.

``Schedule.simulate`` runs a schedule on a time model (by default ``F = 1``, a whole backward
``2``, ``B = W = 1`` apart): that is how the predicted bubble fraction, the chart and the
order of the point-to-point transfers are derived. ``transfers`` orders every send/recv pair
of a step in one global order; each rank's program follows it, which is why no schedule can
deadlock even when a send blocks until its peer receives (the first pending transfer of
that order always has both of its ranks ready to meet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..strategies.base import StrategyError

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zero-bubble")
_ALIASES = {"pipedream-flush": "1f1b", "1F1B": "1f1b", "interleaved-1f1b": "interleaved", "zb": "zero-bubble",
            "zb-h1": "zero-bubble", "zero_bubble": "zero-bubble", "GPipe": "gpipe"}


class PipelineError(StrategyError):
    """A pipeline that cannot be built as asked (the message names the option and the fix)."""


@dataclass(frozen=True, order=True)
class Action:
    """``kind`` (``F``, ``B`` or ``W``) of model chunk ``chunk`` on microbatch ``mb``."""

    kind: str
    chunk: int
    mb: int

    def label(self, virtual: int = 1, stages: int = 1) -> str:
        """``F3`` (microbatch 3), or ``F3.1`` for the second chunk of a rank with ``virtual > 1``."""
        return f"{self.kind}{self.mb}" + (f".{self.chunk // stages}" if virtual > 1 else "")


@dataclass(frozen=True)
class Transfer:
    """One point-to-point tensor hand-over of a step: what ``src`` sends to ``dst`` after its
    action ``after`` and ``dst`` needs before ``before`` (None: the step's end, for the tied
    weights' gradients). ``what`` is ``"act"`` (forward activations of chunk ``after.chunk``),
    ``"grad"`` (their gradients, flowing back) or ``"tied"``."""

    src: int
    dst: int
    what: str
    after: Action | None
    before: Action | None
    time: float
    key: tuple = field(default=(), compare=False)


@dataclass
class Timeline:
    """Start and end time of every action of a simulated schedule, per rank."""

    start: dict[Action, float]
    end: dict[Action, float]
    makespan: float
    busy: list[float]

    @property
    def bubble(self) -> float:
        """The fraction of rank-time spent idle: 1 - busy / (ranks * makespan)."""
        n = len(self.busy)
        return 1.0 - sum(self.busy) / (n * self.makespan) if self.makespan > 0 else 0.0


def default_times(split: bool) -> Callable[[Action], float]:
    """The unit time model: F = 1, a whole backward = 2 (B = W = 1 when split)."""
    if split:
        return lambda a: 1.0
    return lambda a: 1.0 if a.kind == "F" else 2.0


@dataclass
class Schedule:
    """Per pp rank, the actions it runs, in order. ``stages``: pp ranks ``S``; ``virtual``:
    chunks per rank ``v``; ``split``: backwards run as ``B`` and ``W`` apart;
    ``forward_only``: no backward (inference)."""

    name: str
    stages: int
    virtual: int
    microbatches: int
    actions: list[list[Action]]
    split: bool = False
    forward_only: bool = False

    @property
    def chunks(self) -> int:
        return self.stages * self.virtual

    def rank_of(self, chunk: int) -> int:
        return chunk % self.stages

    def chunks_of(self, rank: int) -> list[int]:
        return [c for c in range(self.chunks) if c % self.stages == rank]

    def validate(self) -> None:
        """Every (chunk, microbatch) has its F, B (and W) exactly once, on the chunk's rank,
        in that order; raises PipelineError naming the first that does not."""
        kinds = ("F",) if self.forward_only else (("F", "B", "W") if self.split else ("F", "B"))
        for r, acts in enumerate(self.actions):
            pos: dict[Action, int] = {}
            for i, a in enumerate(acts):
                if a.kind not in kinds:
                    raise PipelineError(f"schedule {self.name}: rank {r} runs {a.label()} of chunk {a.chunk}, but "
                                        f"this schedule has only {', '.join(kinds)} actions")
                if self.rank_of(a.chunk) != r:
                    raise PipelineError(f"schedule {self.name}: rank {r} runs {a.kind} of chunk {a.chunk}, which "
                                        f"lives on rank {self.rank_of(a.chunk)}")
                if a in pos:
                    raise PipelineError(f"schedule {self.name}: rank {r} runs {a.kind}{a.mb} of chunk {a.chunk} twice")
                pos[a] = i
            for c in self.chunks_of(r):
                for m in range(self.microbatches):
                    prev = None
                    for k in kinds:
                        a = Action(k, c, m)
                        if a not in pos:
                            raise PipelineError(f"schedule {self.name}: rank {r} never runs {k}{m} of chunk {c}")
                        if prev is not None and pos[a] < pos[prev]:
                            raise PipelineError(f"schedule {self.name}: rank {r} runs {k}{m} of chunk {c} before "
                                                f"its {prev.kind}")
                        prev = a

    def deps(self, a: Action) -> list[Action]:
        """The actions of other chunks that ``a`` waits for (its own rank's order aside)."""
        last = self.chunks - 1
        if a.kind == "F":
            return [Action("F", a.chunk - 1, a.mb)] if a.chunk > 0 else []
        if a.kind == "B":
            return [Action("B", a.chunk + 1, a.mb)] if a.chunk < last else [Action("F", a.chunk, a.mb)]
        return [Action("B", a.chunk, a.mb)]

    def simulate(self, times: Callable[[Action], float] | None = None) -> Timeline:
        """Run the schedule on the time model ``times`` (default ``default_times``): each rank
        runs its actions in order, each as soon as its rank is free and what it needs from
        the other chunks is done. Raises PipelineError if the order can never finish (a
        rank waits for an action that waits for it)."""
        if times is None:
            # The unit-time timeline is asked for by the program order, the transfers, the
            # bubble and the chart: played once (512 microbatches on 64 ranks are 65,536 actions).
            key = (id(self.actions), sum(len(a) for a in self.actions))
            cached = self.__dict__.get("_unit_timeline")
            if cached is None or cached[0] != key:
                cached = (key, self._simulate(default_times(self.split)))
                self.__dict__["_unit_timeline"] = cached
            return cached[1]
        return self._simulate(times)

    def _simulate(self, times: Callable[[Action], float]) -> Timeline:
        start: dict[Action, float] = {}
        end: dict[Action, float] = {}
        pcs = [0] * self.stages
        free = [0.0] * self.stages
        busy = [0.0] * self.stages
        remaining = sum(len(a) for a in self.actions)
        while remaining:
            progressed = False
            for r in range(self.stages):
                while pcs[r] < len(self.actions[r]):
                    a = self.actions[r][pcs[r]]
                    need = self.deps(a)
                    if any(d not in end for d in need):
                        break
                    t0 = max([free[r]] + [end[d] for d in need])
                    d = times(a)
                    start[a], end[a] = t0, t0 + d
                    free[r] = t0 + d
                    busy[r] += d
                    pcs[r] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                stuck = [f"rank {r} at {self.actions[r][pcs[r]].kind}{self.actions[r][pcs[r]].mb} of chunk "
                         f"{self.actions[r][pcs[r]].chunk}" for r in range(self.stages) if pcs[r] < len(self.actions[r])]
                raise PipelineError(f"schedule {self.name} cannot finish: {'; '.join(stuck)} each wait for another "
                                    "rank's action that comes later in that rank's order")
        return Timeline(start, end, max(end.values(), default=0.0), busy)

    def bubble(self, times: Callable[[Action], float] | None = None) -> float:
        """The predicted bubble fraction on the time model ``times`` (default: unit times;
        for 1F1B with equal stage times that is (S - 1) / (M + S - 1))."""
        return self.simulate(times).bubble

    def in_flight(self) -> list[int]:
        """Per rank, the most microbatches whose forward ran and whose backward has not yet
        finished (their activations are held): at most ``S - p`` under 1F1B, ``M`` under GPipe
        (times ``v`` chunks for the interleaved schedule)."""
        out = []
        done = "W" if self.split else "B"
        for acts in self.actions:
            n = peak = 0
            for a in acts:
                if a.kind == "F":
                    n += 1
                    peak = max(peak, n)
                elif a.kind == done or self.forward_only:
                    n -= 1
            out.append(peak if not self.forward_only else 1)
        return out

    def transfers(self, tied: bool = False, times: Callable[[Action], float] | None = None) -> list[Transfer]:
        """Every point-to-point hand-over of one step, in the global order every rank's
        program follows: by the simulated time the sender finishes, then by a fixed key.
        ``tied``: the first and last chunks' ranks also swap the gradient of a weight they
        share, after everything else (last -> first, then first -> last)."""
        tl = self.simulate(times)
        last = self.chunks - 1
        S = self.stages
        end = tl.end
        out: list[Transfer] = []
        for acts in self.actions:
            for a in acts:
                kind, c, mb = a.kind, a.chunk, a.mb
                if kind == "F" and c < last:
                    t = end[a]
                    out.append(Transfer(c % S, (c + 1) % S, "act", a, Action("F", c + 1, mb), t, (t, 0, c, mb)))
                elif kind == "B" and c > 0:
                    t = end[a]
                    out.append(Transfer(c % S, (c - 1) % S, "grad", a, Action("B", c - 1, mb), t, (t, 1, c, mb)))
        if tied and not self.forward_only:
            t = tl.makespan
            f, l_ = self.rank_of(0), self.rank_of(last)
            out.append(Transfer(l_, f, "tied", None, None, t, (t, 2, 0, 0)))
            out.append(Transfer(f, l_, "tied", None, None, t, (t, 3, 0, 0)))
        out.sort(key=lambda x: x.key)
        return out

    def program_order(self, tied: bool = False, times: Callable[[Action], float] | None = None
                      ) -> list[list[Action | Transfer]]:
        """Per rank, its actions and the transfers it takes part in, in program order: a
        send right after the action that produces it, a recv before the action that needs
        it, and the transfers of each rank in the global order of ``transfers``."""
        tl = self.simulate(times)
        trs = self.transfers(tied, times)
        order = {id(t): i for i, t in enumerate(trs)}
        mine: list[list[Transfer]] = [[] for _ in self.actions]
        for t in trs:
            mine[t.src].append(t)
            if t.dst != t.src:
                mine[t.dst].append(t)
        out: list[list[Action | Transfer]] = []
        for r, acts in enumerate(self.actions):
            items: list[tuple[tuple, Action | Transfer]] = [((tl.start[a], 1, i), a) for i, a in enumerate(acts)]
            items += [((t.time, 0, order[id(t)]), t) for t in mine[r]]
            items.sort(key=lambda x: x[0])
            out.append([x for _, x in items])
        return out

    def chart(self, width: int = 6, max_cells: int = 200) -> str:
        """The schedule as text: one row per rank, one cell per time unit of the simulation
        (unit times), each cell the action running then (``F3``: forward of microbatch 3,
        ``B``/``W`` the backward parts, ``.3`` the chunk for interleaving), ``.`` idle."""
        tl = self.simulate()
        unit = 1.0
        n = int(round(tl.makespan / unit))
        rows = []
        for r, acts in enumerate(self.actions):
            cells = ["."] * n
            for a in acts:
                s, e = int(round(tl.start[a] / unit)), int(round(tl.end[a] / unit))
                for k in range(s, e):
                    cells[k] = a.label(self.virtual, self.stages)
            shown = cells[:max_cells]
            rows.append(f"rank {r:<2}|" + "".join(c.ljust(width - 1)[:width - 1] + "|" for c in shown)
                        + (" ..." if n > max_cells else ""))
        legend = (f"{self.name}: {self.stages} ranks x {self.virtual} chunk(s), {self.microbatches} microbatches; "
                  f"one cell per unit of time (F = 1, " + ("B = W = 1" if self.split else "B = 2") +
                  f"); predicted bubble {tl.bubble:.1%}")
        return legend + "\n" + "\n".join(rows)


def _check_counts(name: str, stages: int, microbatches: int, virtual: int) -> None:
    for what, n in (("pp ranks", stages), ("microbatches", microbatches), ("virtual_stages", virtual)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PipelineError(f"schedule {name}: {what} must be a positive int, got {n!r}")


def gpipe(stages: int, microbatches: int, forward_only: bool = False) -> Schedule:
    """All forwards, then all backwards (each in microbatch order)."""
    _check_counts("gpipe", stages, microbatches, 1)
    acts = []
    for p in range(stages):
        row = [Action("F", p, m) for m in range(microbatches)]
        if not forward_only:
            row += [Action("B", p, m) for m in range(microbatches)]
        acts.append(row)
    return Schedule("gpipe", stages, 1, microbatches, acts, forward_only=forward_only)


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """PipeDream-flush: ``S - p - 1`` warm-up forwards on rank ``p``, then one forward and
    one backward in turn, then the remaining backwards."""
    _check_counts("1f1b", stages, microbatches, 1)
    acts = []
    for p in range(stages):
        warm = min(stages - p - 1, microbatches)
        row = [Action("F", p, m) for m in range(warm)]
        for i in range(microbatches - warm):
            row += [Action("F", p, warm + i), Action("B", p, i)]
        row += [Action("B", p, m) for m in range(microbatches - warm, microbatches)]
        acts.append(row)
    return Schedule("1f1b", stages, 1, microbatches, acts)


def _check_interleaved(stages: int, microbatches: int, virtual: int) -> None:
    _check_counts("interleaved", stages, microbatches, virtual)
    if microbatches % stages:
        lower, upper = microbatches // stages * stages, (microbatches // stages + 1) * stages
        fix = f"microbatches={lower} or {upper}" if lower else f"microbatches={upper} or {upper + stages}"
        raise PipelineError(f"schedule interleaved: microbatches={microbatches} is not a multiple of the {stages} pp "
                            f"ranks; the interleaved schedule runs microbatches in rounds of {stages}: use {fix}")


def interleaved(stages: int, microbatches: int, virtual: int) -> Schedule:
    """Megatron-LM's interleaved 1F1B: rank ``p`` holds chunks ``p, p + S, ...``; forwards go
    through its chunks in rounds of ``S`` microbatches, backwards through them in reverse;
    ``(v - 1) * S + 2 * (S - p - 1)`` warm-up forwards (capped at ``M * v``)."""
    _check_interleaved(stages, microbatches, virtual)
    total = microbatches * virtual

    def fwd(k: int, p: int) -> Action:
        local = (k // stages) % virtual
        return Action("F", local * stages + p, (k // (stages * virtual)) * stages + k % stages)

    def bwd(k: int, p: int) -> Action:
        local = virtual - 1 - (k // stages) % virtual
        return Action("B", local * stages + p, (k // (stages * virtual)) * stages + k % stages)

    acts = []
    for p in range(stages):
        warm = min((virtual - 1) * stages + 2 * (stages - p - 1), total)
        row = [fwd(k, p) for k in range(warm)]
        for i in range(total - warm):
            row += [fwd(warm + i, p), bwd(i, p)]
        row += [bwd(k, p) for k in range(total - warm, total)]
        acts.append(row)
    return Schedule("interleaved", stages, virtual, microbatches, acts)


def zero_bubble(stages: int, microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023, the schedule torch's ScheduleInterleavedZeroBubble builds for
    one chunk per rank): the backward split into ``B`` (input gradients, on the critical
    path) and ``W`` (weight gradients, needed only by the optimizer). Rank ``p`` runs 1F1B's
    ``S - p - 1`` warm-up forwards and its alternation of ``F`` and ``B``, with each ``B``
    followed by one ``W`` once ``p`` backwards have run: the first ``p`` weight passes are
    deferred to the drain, where 1F1B leaves rank ``p`` idle, so the later ranks return
    their input gradients sooner and the earlier ranks wait less."""
    _check_counts("zero-bubble", stages, microbatches, 1)
    S, M = stages, microbatches
    acts: list[list[Action]] = []
    for p in range(S):
        warm = min(S - p - 1, M)
        row = [Action("F", p, m) for m in range(warm)]
        w_next = 0
        for i in range(M):
            if warm + i < M:
                row.append(Action("F", p, warm + i))
            row.append(Action("B", p, i))
            if i >= p:
                row.append(Action("W", p, w_next))
                w_next += 1
        row += [Action("W", p, m) for m in range(w_next, M)]
        acts.append(row)
    return Schedule("zero-bubble", S, 1, M, acts, split=True)


def check_schedule(name: str, stages: int, microbatches: int, virtual: int = 1) -> str:
    """What ``make_schedule`` checks, without building the schedule (whose actions grow as
    stages x microbatches x virtual): the name, the counts and how they fit. Returns the
    schedule's canonical name."""
    key = _schedule_key(name, virtual)
    if key == "interleaved":
        _check_interleaved(stages, microbatches, virtual)
    else:
        _check_counts(key, stages, microbatches, virtual)
    return key


def make_schedule(name: str, stages: int, microbatches: int, virtual: int = 1, forward_only: bool = False) -> Schedule:
    """The schedule named ``name`` (``gpipe``, ``1f1b``, ``interleaved``, ``zero-bubble``)."""
    key = _schedule_key(name, virtual)
    if forward_only:
        if key == "interleaved":
            s = interleaved(stages, microbatches, virtual)
            acts = [[a for a in row if a.kind == "F"] for row in s.actions]
            return Schedule("interleaved", stages, virtual, microbatches, acts, forward_only=True)
        return gpipe(stages, microbatches, forward_only=True)
    if key == "gpipe":
        return gpipe(stages, microbatches)
    if key == "1f1b":
        return one_f_one_b(stages, microbatches)
    if key == "interleaved":
        return interleaved(stages, microbatches, virtual)
    return zero_bubble(stages, microbatches)


def _schedule_key(name: str, virtual: int) -> str:
    if not isinstance(name, str):
        raise PipelineError(f"schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    key = _ALIASES.get(name, name.strip().lower())
    if key not in SCHEDULES:
        import difflib

        near = difflib.get_close_matches(key, SCHEDULES + tuple(_ALIASES), n=1, cutoff=0.5)
        hint = f" (did you mean '{_ALIASES.get(near[0], near[0])}'?)" if near else ""
        raise PipelineError(f"unknown pipeline schedule '{name}'{hint}; choose one of {', '.join(SCHEDULES)}")
    if virtual != 1 and key != "interleaved":
        raise PipelineError(f"virtual_stages={virtual} needs schedule='interleaved' (schedule '{key}' runs one "
                            "chunk per rank); use schedule='interleaved' or leave virtual_stages out")
    return key


__all__ = ["Action", "PipelineError", "SCHEDULES", "Schedule", "Timeline", "Transfer", "default_times", "gpipe",
           "interleaved", "check_schedule", "make_schedule", "one_f_one_b", "zero_bubble"]
