"""What one rank's program holds in device memory: its model states (params, gradients,
optimizer state) and the peak of everything live as the program runs in order.

``memory_report(graph)`` walks the per-rank program once:

- **params**, **optimizer state** (``state`` inputs: AdamW's moments, the f32 master weights,
  the step counter; a model's buffers too) and the **batch** (``input`` inputs) live through
  the whole step; an updated param or state (an output aliasing its input) is written where
  it was, as the runtime donates those buffers;
- **gradients** are what each optimizer update consumes, counted where the data-parallel
  reduction leaves them: the result of the all_reduce / reduce_scatter (a bucket counts the
  whole bucket) that the update's gradient operand reads through casts, reshapes, slices and
  scalings; without a reduction, the gradient the backward made. This is ZeRO's accounting
  (Rajbhandari et al. 2020, section 3): the gradient buffers a rank holds for the step;
- every other result lives from its node to its last reader (a view, ``reshape`` /
  ``squeeze`` / ``unsqueeze``, shares its operand's buffer); collective and recv results are
  **communication** buffers, the rest **activations and temporaries**. A send's copy is
  counted while the send runs only: a runtime frees it when the transfer completes (partita's
  CPU runtime keeps it until the step ends; docs/cluster.md);
- constants the runtime computes once are counted for the whole step.

The **peak** is the largest total of live bytes at any node; the report also gives what was
live at that point by category. ``eager``: ops priced as eager PyTorch's chains of kernels
(``simulate(fusion=...)``, partita/cluster/eager.py): while one runs, the intermediates its chain
holds (``eager.transient_bytes``) count too, as "activations and temporaries".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

from ..ir.graph import Graph, Value
from ..ops.kinds import COLLECTIVE_OPS, UPDATE_OPS as UPDATES, VIEW_OPS as VIEWS
from ..ops.registry import OPS
from .allocator import last_reads, reserved_peak
from .eager import transient_bytes
from .hardware import Device, format_quantity

# What a gradient passes through between its reduction and the update that reads it.
GRAD_PATH = frozenset({"cast", "reshape", "squeeze", "unsqueeze", "slice", "split", "shard_slice", "mul", "div",
                        "transpose"})
# What a communication buffer holds: a collective's result, or a received activation.
COMM_OPS = COLLECTIVE_OPS | {"recv"}


@dataclass
class MemoryReport:
    """One rank's memory, in bytes (see the module docstring)."""

    params: int
    grads: int
    optimizer: int
    batch: int
    peak: int                                     # the most bytes live at once
    at_peak: dict[str, int] = field(default_factory=dict)   # category -> bytes live at the peak
    peak_node: str = ""                           # where the peak is
    reserved: int | None = None                   # the caching allocator's peak reserved (allocator.py)

    @property
    def model_states(self) -> int:
        """Params, gradients and optimizer state: ZeRO's model states."""
        return self.params + self.grads + self.optimizer

    def text(self, capacity: float | None = None) -> str:
        fq = format_quantity
        lines = [f"params {fq(self.params, 'B')}, gradients {fq(self.grads, 'B')}, optimizer state "
                 f"{fq(self.optimizer, 'B')} (model states {fq(self.model_states, 'B')}); batch {fq(self.batch, 'B')}",
                 f"peak {fq(self.peak, 'B')} at {self.peak_node or 'the start'}: " +
                 ", ".join(f"{k} {fq(v, 'B')}" for k, v in self.at_peak.items() if v)]
        if capacity is not None:
            lines[-1] += f" ({self.peak / capacity:.0%} of {fq(capacity, 'B')})"
        if self.reserved is not None:
            lines.append(f"reserved {fq(self.reserved, 'B')} at its peak (PyTorch's caching allocator, modelled)")
        return "\n".join(lines)

    def over_message(self, rank: int, device: Device) -> str:
        fq = format_quantity
        return (f"rank {rank} does not fit in the memory of a {device.name}: it needs {fq(self.peak, 'B')} at its "
                f"peak ({self.peak_node}), {fq(self.peak - device.memory, 'B')} more than the device's "
                f"{fq(device.memory, 'B')}; " + ", ".join(f"{k} {fq(v, 'B')}" for k, v in self.at_peak.items() if v) +
                ". Shard more (zero1-3, a wider tp or pp axis), recompute activations, or use smaller microbatches")


def gradient_buffers(graph: Graph) -> set[Value]:
    """The values that hold the gradients the optimizer updates read (see the module
    docstring)."""
    out: set[Value] = set()
    for node in graph.nodes:
        if node.op not in UPDATES or len(node.operands) < 2:
            continue
        v = node.operands[1]
        while v.producer is not None and v.producer.op in GRAD_PATH and v.producer.op not in COMM_OPS:
            p = v.producer
            # Follow the float operand (a scaling multiplies by a scalar constant).
            nxt = max(p.operands, key=lambda o: o.type.numel) if p.operands else None
            if nxt is None:
                break
            v = nxt
        out.add(v)
    return out


def live_bytes(graph: Graph, grads: set[Value]) -> Iterator[tuple[int, Any, int, dict[str, int]]]:
    """Walk the program in order (see the module docstring): after each node that allocates
    (not a constant, not a view), ``(index, node, constants' bytes so far, live bytes by
    category)``, before the buffers last read there are freed. The dict is the walk's own:
    copy it to keep it. ``grads``: ``gradient_buffers(graph)``."""
    nodes = list(graph.nodes)
    outputs = set(graph.outputs)
    aliased = {v for v, a in zip(graph.outputs, graph.output_aliases or []) if a is not None}
    last = last_reads(graph, nodes)
    consts = 0
    live = {"activations and temporaries": 0, "communication": 0, "gradients": 0}
    frees: dict[int, list[tuple[str, int]]] = {}
    for i, n in enumerate(nodes):
        op = OPS[n.op]
        if not n.operands and len(n.results) == 1 and not op.effects_of(n.attrs) and n.results[0] not in outputs:
            consts += n.results[0].type.nbytes
            continue
        if n.op in VIEWS:
            continue
        for r in n.results:
            if r in aliased:
                continue   # written into its donated input
            cat = "gradients" if r in grads else "communication" if n.op in COMM_OPS else \
                "activations and temporaries"
            size = r.type.nbytes
            live[cat] += size
            frees.setdefault(max(last.get(r, i), i), []).append((cat, size))
        if n.op == "send":
            size = n.operands[0].type.nbytes
            live["communication"] += size
            frees.setdefault(i, []).append(("communication", size))
        yield i, n, consts, live
        for cat, size in frees.pop(i, ()):
            live[cat] -= size


def constant_bytes(graph: Graph) -> int:
    """The bytes of the constants the runtime computes once (counted for the whole step)."""
    outputs = set(graph.outputs)
    return sum(n.results[0].type.nbytes for n in graph.nodes
               if not n.operands and len(n.results) == 1 and not OPS[n.op].effects_of(n.attrs)
               and n.results[0] not in outputs)


def memory_report(graph: Graph, eager: frozenset[str] = frozenset(), capacity: float | None = None) -> MemoryReport:
    """The memory of one run of ``graph`` on one rank (see the module docstring); ``eager``: the
    ops whose eager chains' intermediates count while they run; ``capacity``: the device's
    memory, given to price the caching allocator's reserved bytes too (``allocator.py``)."""
    params = sum(v.type.nbytes for v in graph.inputs if v.role == "param")
    optimizer = sum(v.type.nbytes for v in graph.inputs if v.role == "state")
    batch = sum(v.type.nbytes for v in graph.inputs if v.role not in ("param", "state"))
    grads_v = gradient_buffers(graph)
    grads = sum(v.type.nbytes for v in grads_v)
    base = params + optimizer + batch
    peak, peak_node = base, ""
    peak_at = {"activations and temporaries": 0, "communication": 0, "gradients": 0}
    for _, n, consts, live in live_bytes(graph, grads_v):
        extra = transient_bytes(n) if n.op in eager else 0
        total = base + consts + sum(live.values()) + extra
        if total > peak:
            peak, peak_at, peak_node = total, dict(live), where_of(n)
            peak_at["activations and temporaries"] += extra
    at_peak = {"params": params, "optimizer state": optimizer, "batch": batch,
               "constants": constant_bytes(graph), **peak_at}
    reserved = None
    if capacity is not None:
        reserved = reserved_peak(graph, eager, capacity).reserved_peak
    return MemoryReport(params, grads, optimizer, batch, peak, at_peak, peak_node, reserved)


def where_of(n: Any) -> str:
    """A node as a report names it: ``%name = op``, or the op alone."""
    r = n.results[0].name if n.results and n.results[0].name else ""
    return f"%{r} = {n.op}" if r else n.op
