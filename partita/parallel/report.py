"""The plan report of ``parallelize``: what was placed where, every collective and why, the
bytes per rank (``PlanReport``: ``summary()``, ``text()``, ``to_json()``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from ..ir.graph import Graph, Value
from ..ir.printer import value_names
from ..ir.mesh import Mesh
from .partition import PartitionReport
from .propagate import PropagationReport
from .strategies.base import UPDATE_OPS


@dataclass
class PlanReport:
    """What ``parallelize`` decided, for people (``text()``) and tools (``to_json()``)."""

    mesh: Mesh
    strategy: str
    placements: dict[str, str]
    collectives: list[dict]
    replicated: list[str]
    notes: list[str]
    param_bytes: int
    state_bytes: int
    activation_bytes: int
    global_param_bytes: int
    timings: dict[str, float] = field(default_factory=dict)
    buckets: list[dict] = field(default_factory=list)
    program_collectives: int = 0

    @property
    def comm_bytes(self) -> int:
        """Bytes each rank sends per step over every collective of the per-rank program."""
        return sum(c["bytes"] for c in self.collectives)

    def count(self, op: str | None = None, axis: str | None = None, phase: str | None = None) -> int:
        """How many collectives match ``op``, ``axis`` and ``phase`` ("forward", "backward",
        "update"; None: any)."""
        return sum(1 for c in self.collectives if (op is None or c["op"] == op) and
                   (axis is None or c["axis"] == axis) and (phase is None or c["phase"] == phase))

    def to_dict(self) -> dict:
        return {"mesh": str(self.mesh), "strategy": self.strategy, "placements": self.placements,
                "collectives": self.collectives, "comm_bytes_per_step": self.comm_bytes,
                "per_rank": {"param_bytes": self.param_bytes, "optimizer_state_bytes": self.state_bytes,
                             "activation_bytes": self.activation_bytes},
                "global_param_bytes": self.global_param_bytes, "replicated_no_rule": self.replicated,
                "notes": self.notes, "timings_s": self.timings, "buckets": self.buckets,
                "collectives_in_program": self.program_collectives}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        """A few lines: mesh, strategy, bytes per rank, collectives by op, axis and phase."""
        lines = [f"plan: {self.strategy} on {self.mesh} ({self.mesh.size} ranks)",
                 f"  per rank: params {format_bytes(self.param_bytes)} (of {format_bytes(self.global_param_bytes)}), optimizer "
                 f"state {format_bytes(self.state_bytes)}, peak activations {format_bytes(self.activation_bytes)}",
                 f"  communication per step: {format_bytes(self.comm_bytes)} sent per rank in {len(self.collectives)} "
                 "collective(s)"]
        groups: dict[tuple[str, str, str], list[int]] = {}
        for c in self.collectives:
            groups.setdefault((c["phase"], c["op"], c["axis"]), []).append(c["bytes"])
        for (phase, op, axis), bs in sorted(groups.items()):
            lines.append(f"    {phase:8} {op:14} over {axis:4} x{len(bs):<4} {format_bytes(sum(bs))}")
        for b in self.buckets:
            lines.append(f"  bucket: {len(b['members'])} {b['op']}s over {b['axis']} fused into one "
                         f"({format_bytes(b['bytes'])})")
        if self.program_collectives:
            lines.append(f"  the per-rank program issues {self.program_collectives} collective(s)")
        if self.replicated:
            lines.append(f"  replicated for lack of a sharding rule: {len(self.replicated)} op(s)")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)

    def text(self) -> str:
        """The full report: the summary, every collective with its reason, every placement."""
        lines = [self.summary(), "collectives (why each was inserted):"]
        for c in self.collectives:
            at = f" at {c['source']}" if c.get("source") else ""
            if c.get("inside"):
                lines.append(f"  [{c['phase']}] {c['op']} over {c['axis']}: inside {c['consumer']}{at} (its "
                             f"distributed form), {c['bytes']} bytes")
                continue
            lines.append(f"  [{c['phase']}] {c['op']} over {c['axis']}: %{c['value']} {c['have']} -> {c['want']} "
                         f"for {c['consumer']}{at}, {c['bytes']} bytes")
        if self.replicated:
            lines.append("replicated (no sharding rule):")
            lines += [f"  {r}" for r in self.replicated]
        lines.append("placements:")
        lines += [f"  %{k}: {v}" for k, v in self.placements.items()]
        return "\n".join(lines)


def format_bytes(n: int) -> str:
    """A byte count in B, KiB, MiB or GiB, as the reports print it."""
    x = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if x < 1024 or unit == "GiB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return str(x)


def _nbytes(v: Value) -> int:
    return math.prod(v.type.shape) * v.type.dtype.itemsize


def build_plan(g: Graph, local: Graph, mesh: Mesh, strategy: str, prop: PropagationReport, part: PartitionReport,
               notes: list[str], timings: dict[str, float]) -> PlanReport:
    """The plan of a parallelized graph ``g`` and its per-rank program ``local``."""
    from ..autodiff.recompute import backward_start

    names = value_names(g)
    order = {}
    start = backward_start(g)
    phase = "forward"
    for node in g.nodes:
        if node is start:
            phase = "backward"
        if node.op in UPDATE_OPS:
            ph = "update"
        else:
            ph = phase
        res = ", ".join(f"%{names.get(r, '?')}" for r in node.results)
        order[f"{res + ' = ' if res else ''}{node.op}"] = ph
        order[f"result of {res + ' = ' if res else ''}{node.op}"] = ph
    colls = []
    for c in part.collectives:
        ph = order.get(c.consumer, "output" if c.consumer.startswith("output") else "forward")
        colls.append({"op": c.op, "axis": c.axis, "value": c.value, "consumer": c.consumer,
                      "operand": c.operand, "have": str(c.have), "want": str(c.want), "bytes": c.bytes,
                      "phase": ph, "inside": c.inside, "source": c.source})
    param_b = sum(_nbytes(v) for v in local.inputs if v.role == "param")
    state_b = sum(_nbytes(v) for v in local.inputs if v.role == "state")
    from ..autodiff.recompute import analyze

    # The peak of live bytes over the per-rank program's node order, inputs excluded.
    mem = analyze(local)
    act_b = max(mem.peak_bytes - mem.input_bytes, 0)
    gparam = sum(_nbytes(v) for v in g.inputs if v.role == "param")
    return PlanReport(mesh, strategy, dict(prop.placements), colls, list(prop.replicated), notes, param_b, state_b,
                      act_b, gparam, timings)


__all__ = ["PlanReport", "build_plan"]
