"""The plan report of a pipeline: per stage its layers, the memory it holds (params,
gradients, optimizer state, peak activations), the bytes it sends per step, the schedule as
a chart and its predicted bubble; after a launch, the bubble measured (``measured_bubble``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...autodiff.recompute import analyze
from ...ir.graph import Graph, Value
from ...ops.collective import is_point_to_point
from ..report import format_bytes
from .local_unroll import ONCE_SECTIONS


@dataclass
class StageReport:
    """One pp rank: its chunks and layers, what one of its ranks holds, and what it sends."""

    rank: int
    chunks: list[int]
    layers: list[str]
    nodes: int
    param_bytes: int
    grad_bytes: int
    state_bytes: int
    activation_bytes_per_microbatch: int
    in_flight: int
    peak_activation_bytes: int
    program_peak_bytes: int
    sent_bytes: int
    sends: int
    recvs: int
    chunk_layers: list[list[str]] = field(default_factory=list)  # per chunk of the rank

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class PipelinePlan:
    """What ``parallelize`` with pp decided (``summary()``, ``text()``, ``to_json()``)."""

    mesh: str
    strategy: str
    schedule: str
    stages: int
    virtual_stages: int
    microbatches: int
    cut: str
    per_stage: list[StageReport]
    bubble: float
    chart: str
    tied: list[str]
    stage_plans: list[Any]
    timings: dict[str, float] = field(default_factory=dict)
    measured_bubble: float | None = None
    measured_wait_s: list[float] | None = None

    @property
    def comm_bytes(self) -> int:
        return sum(s.sent_bytes for s in self.per_stage)

    def summary(self) -> str:
        lines = [f"plan: {self.strategy} on {self.mesh}: {self.stages} pipeline stage(s)"
                 + (f" x {self.virtual_stages} virtual" if self.virtual_stages > 1 else "")
                 + f", {self.microbatches} microbatches, schedule {self.schedule}; predicted bubble {self.bubble:.1%}"
                 + (f", measured {self.measured_bubble:.1%}" if self.measured_bubble is not None else ""),
                 f"  cut: {self.cut}"]
        if self.tied:
            lines.append(f"  shared by the first and last stage, gradients summed between them: "
                         f"{', '.join('%' + t for t in self.tied)}")
        lines.append(f"  {'stage':>5}  {'layers':<22} {'params':>10} {'grads':>10} {'opt state':>10} "
                     f"{'act/mb':>10} {'held':>4} {'peak act':>10} {'sent/step':>10}")
        for s in self.per_stage:
            span = "+".join(_span(ls) for ls in s.chunk_layers) if s.chunk_layers else "-"
            lines.append(f"  {s.rank:>5}  {span:<22} {format_bytes(s.param_bytes):>10} {format_bytes(s.grad_bytes):>10} "
                         f"{format_bytes(s.state_bytes):>10} {format_bytes(s.activation_bytes_per_microbatch):>10} {s.in_flight:>4} "
                         f"{format_bytes(s.peak_activation_bytes):>10} {format_bytes(s.sent_bytes):>10}")
        lines.append("  (per rank of the stage; 'held': the most microbatches whose activations the schedule keeps "
                     "at once)")
        seen: set[str] = set()
        for p, sp in enumerate(self.stage_plans):
            if sp is not None:
                first = sp.summary().splitlines()
                lines.append(f"  stage {p}: " + first[0].removeprefix("plan: "))
                lines += ["  " + x for x in first[1:3]]
                for n in sp.notes:
                    if n not in seen:
                        seen.add(n)
                        lines.append(f"    note: {n}")
        return "\n".join(lines)

    def text(self) -> str:
        return self.summary() + "\n\nschedule:\n" + self.chart

    def to_dict(self) -> dict:
        return {"mesh": self.mesh, "strategy": self.strategy, "schedule": self.schedule, "stages": self.stages,
                "virtual_stages": self.virtual_stages, "microbatches": self.microbatches, "cut": self.cut,
                "predicted_bubble": self.bubble, "measured_bubble": self.measured_bubble,
                "measured_wait_s": self.measured_wait_s, "tied": self.tied,
                "per_stage": [s.to_dict() for s in self.per_stage],
                "stage_plans": [sp.to_dict() if sp is not None else None for sp in self.stage_plans],
                "timings_s": self.timings, "chart": self.chart}

    def record_measured(self, run: Any) -> None:
        """Take the bubble as measured in a launch (``run``: its RunResult): per step, the
        fraction of the slowest rank's step time that the ranks spent waiting inside recvs,
        averaged over the ranks and over the steps after the first (which also pays for
        warm-up)."""
        have = [r for r in run.ranks if run.recv_seconds and run.recv_seconds[r] is not None]
        if not have or not run.steps:
            return
        steps = list(range(1, run.steps)) or [0]
        span = run.step_seconds()
        fr = []
        waits = []
        for s in steps:
            w = [run.recv_seconds[r][s] for r in have]
            waits.append(sum(w) / len(w))
            fr.append(sum(w) / (len(w) * span[s]) if span[s] > 0 else 0.0)
        self.measured_bubble = sum(fr) / len(fr)
        self.measured_wait_s = [sum(run.recv_seconds[r][s] for s in steps) / len(steps) for r in have]

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def _span(layers: list[str]) -> str:
    """``h.0..h.3`` for a chunk's layers (one name for one layer)."""
    if not layers:
        return "-"
    return f"{_short(layers[0])}..{_short(layers[-1])}" if len(layers) > 1 else _short(layers[0])


def _short(layer: str) -> str:
    parts = layer.split(".")
    return ".".join(parts[-2:]) if len(parts) >= 2 else layer


def _nbytes(v: Value) -> int:
    return v.type.nbytes


def _saved_bytes(cp: Any) -> int:
    """Bytes of one microbatch's forward values that its backward reads (held from F to B/W)."""
    f = set(cp.F)
    later = set(cp.B) | set(cp.W)
    saved: set[Value] = set()
    for n in later:
        for v in n.operands:
            if v.producer in f:
                saved.add(v)
    return sum(_nbytes(v) for v in saved)


def build_pipeline_plan(prog: Any) -> PipelinePlan:
    pipe = prog.pipeline
    sched = pipe.schedule
    held = sched.in_flight()
    # Activations per microbatch: a stage rank holds its piece (the dp split cuts the rows).
    dp_axis = prog.strategy.dp_axis if prog.strategy is not None else None
    scale = prog.submesh.axis_size(dp_axis) if prog.submesh is not None and dp_axis is not None else 1
    per = []
    # A template copied from another rank's (unroll=False) has its memory: analyzed once.
    copied = getattr(prog, "copied_from", {})
    mems: dict[int, Any] = {}
    for p, st in enumerate(prog.stages):
        local: Graph = st.local
        chunks = sched.chunks_of(p)
        layers = [lay for c in chunks for lay in pipe.cut.chunks[c].layers]
        params = sum(_nbytes(v) for v in local.inputs if v.role == "param")
        state = sum(_nbytes(v) for v in local.inputs if v.role == "state")
        per_mb = sum(_saved_bytes(pipe.chunks[c]) for c in chunks) // scale
        q = copied.get(p)
        mem = mems[q] if q is not None and q in mems else analyze(local)
        mems[p] = mem
        sends = [n for n in local.nodes if is_point_to_point(n) and n.operands]
        recvs = [n for n in local.nodes if is_point_to_point(n) and not n.operands]
        if not getattr(prog, "unrolled", True):
            # A template (unroll=False): its transfers of one microbatch happen once per
            # microbatch; its peak is one microbatch's (the plan says "template").
            sec = prog.templates[p].sections
            sends = [n for n in sends for _ in range(1 if sec[n][0] in ONCE_SECTIONS else sched.microbatches)]
            recvs = [n for n in recvs for _ in range(1 if sec[n][0] in ONCE_SECTIONS else sched.microbatches)]
        per.append(StageReport(p, chunks, layers, len(local), params, params if pipe.training else 0, state,
                               per_mb, held[p], per_mb * held[p] // max(len(chunks), 1),
                               max(mem.peak_bytes - mem.input_bytes, 0),
                               sum(_nbytes(n.operands[0]) for n in sends), len(sends), len(recvs),
                               [list(pipe.cut.chunks[c].layers) for c in chunks]))
    plans = [getattr(st, "plan", None) for st in prog.stages]
    return PipelinePlan(str(prog.mesh), str(prog.strategy), sched.name, sched.stages, sched.virtual,
                        sched.microbatches, pipe.cut.how, per, sched.bubble(), sched.chart(), list(pipe.tied), plans,
                        dict(prog.timings))


__all__ = ["PipelinePlan", "StageReport", "build_pipeline_plan"]
