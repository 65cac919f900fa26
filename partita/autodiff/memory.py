"""Memory of a training graph: what the backward pass keeps alive, the peak, and recompute.

A training step holds every forward value that a backward node reads until that node runs;
those "saved" activations dominate training memory. ``analyze`` reports them and the peak
of live bytes for the graph's node order (inputs counted while they are used, outputs until
the end). ``recompute`` trades a little compute for memory the way activation checkpointing
does at op granularity: a saved value made by a cheap op (elementwise or data movement)
whose operands are kept anyway is computed again right before its first backward use, so the
forward copy dies at the end of the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.graph import Graph, Node, Value
from ..ops.registry import OPS, movement_cost, numel
from ..passes.manager import Pass, register_pass
from .grad import SEED_NAME


def _bytes(v: Value) -> int:
    return numel(v.type.shape) * v.type.dtype.itemsize


def backward_start(graph: Graph) -> Node | None:
    """The first node of the backward section, or None if the graph has none.

    That is the gradient seed (``%grad.seed``) when it is still there. Cleanup passes may
    merge the seed with an equal constant of the forward section (a training step runs cse),
    so a graph whose first output is a scalar loss followed by gradients or updated params
    (outputs aliasing inputs) has its backward section start right after the loss's producer:
    ``grad`` appends every backward node after the whole forward section.
    """
    for n in graph.nodes:
        if any(r.name == SEED_NAME for r in n.results):
            return n
    if len(graph.outputs) < 2 or graph.outputs[0].type.shape != () or graph.outputs[0].producer is None:
        return None
    rest = graph.outputs[1:]
    if not any(a is not None for a in graph.output_aliases[1:]) and not any(
            v.name and v.name.endswith(".grad") for v in rest):
        return None
    return graph.outputs[0].producer.next


@dataclass
class MemoryReport:
    """Saved activations and peak live bytes of one node order."""

    saved: list[tuple[str, int, str]] = field(default_factory=list)  # (value, bytes, producer and line)
    saved_bytes: int = 0
    peak_bytes: int = 0
    peak_at: str = ""            # the node at which the peak is reached
    input_bytes: int = 0         # params, state and batch inputs (held by the caller)

    def text(self, top: int = 10) -> str:
        lines = [f"peak live bytes: {_fmt(self.peak_bytes)} (at {self.peak_at}); inputs {_fmt(self.input_bytes)}",
                 f"kept for backward: {len(self.saved)} values, {_fmt(self.saved_bytes)}"]
        for name, b, op in sorted(self.saved, key=lambda s: -s[1])[:top]:
            lines.append(f"  {name:<24} {_fmt(b):>10}  {op}")
        if len(self.saved) > top:
            lines.append(f"  ... {len(self.saved) - top} more")
        return "\n".join(lines)


def _fmt(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def analyze(graph: Graph) -> MemoryReport:
    """Saved activations (forward values read by the backward section) and the peak of live
    bytes over the graph's node order."""
    rep = MemoryReport()
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    start = backward_start(graph)
    split = pos[start] if start is not None else len(nodes)
    for n in nodes[:split]:
        for r in n.results:
            if any(pos[u] >= split for u in r.users):
                b = _bytes(r)
                loc = n.loc or n.text_loc
                name = f"%{r.name}" if r.name and not r.name.isdigit() else str(r.type)
                rep.saved.append((name, b, n.op + (f" at {loc}" if loc else "")))
                rep.saved_bytes += b
    # Liveness: a node result is live from its node to its last use (the end for outputs);
    # an input from the start to its last use (the end if it is an output or aliased).
    end = len(nodes)
    last: dict[Value, int] = {}
    for i, n in enumerate(nodes):
        for v in n.operands:
            last[v] = i
    for v in graph.outputs:
        last[v] = end
    delta = [0] * (end + 2)
    for v in graph.inputs:
        b = _bytes(v)
        rep.input_bytes += b
        delta[0] += b
        delta[last.get(v, 0) + 1] -= b
    for i, n in enumerate(nodes):
        for r in n.results:
            b = _bytes(r)
            delta[i] += b
            delta[max(last.get(r, i), i) + 1] -= b
    live = 0
    for i in range(end):
        live += delta[i]
        if live > rep.peak_bytes:
            rep.peak_bytes = live
            n = nodes[i]
            loc = n.loc or n.text_loc
            rep.peak_at = f"{n.op}" + (f" at {loc}" if loc else "") + f" (node {i})"
    return rep


def _cheap(node: Node) -> bool:
    op = OPS.get(node.op)
    if op is None or len(node.results) != 1 or op.effects_of(node.attrs):
        return False
    return op.elementwise or op.cost is movement_cost


def recompute(graph: Graph) -> int:
    """Recompute cheap saved values in the backward section; returns how many. In place."""
    start = backward_start(graph)
    if start is None:
        return 0
    count = 0
    changed = True
    while changed:
        changed = False
        in_bwd = _backward_set(graph, start)
        in_order = [r for n in graph.nodes if n not in in_bwd for r in n.results
                    if any(u in in_bwd for u in r.users)]
        saved = set(in_order)
        # Latest first, in node order rather than set order (which follows object ids) so the
        # result is deterministic; a chain of cheap ops is then recomputed whole, since each
        # value's operand is still saved when the value is considered.
        for v in reversed(in_order):
            p = v.producer
            if p is None or not _cheap(p) or v in graph.outputs:
                continue
            # Only when the operands stay alive anyway: inputs, or values already saved.
            if not all(o.producer is None or o in saved for o in p.operands):
                continue
            users = [u for u in v.users if u in in_bwd]
            first = min(users, key=lambda u: u._order)
            clone = Node(p.op, list(p.operands), dict(p.attrs), [v.type], p.loc, [None])
            graph.insert_before(first, clone)
            if first is start:
                # The clone now opens the backward section (else it would count as forward
                # and be "saved" and recomputed again, forever).
                start = clone
            new = clone.results[0]
            for u in users:
                for i, o in enumerate(u.operands):
                    if o is v:
                        graph.set_operand(u, i, new)
            count += 1
            changed = True
            break
    return count


def _backward_set(graph: Graph, start: Node) -> set[Node]:
    out: set[Node] = set()
    seen = False
    for n in graph.nodes:
        seen = seen or n is start
        if seen:
            out.add(n)
    return out


@register_pass
class Recompute(Pass):
    """Recompute cheap forward values (elementwise and data-movement ops whose operands are
    kept anyway) in the backward section instead of keeping them alive across it."""

    name = "recompute"

    def run(self, graph: Graph) -> Graph:
        recompute(graph)
        return graph
