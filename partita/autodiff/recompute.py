"""Memory of a training graph: what the backward pass keeps alive, the peak, and recompute.

A training step holds every forward value that a backward node reads until that node runs;
those "saved" activations dominate training memory. ``analyze`` reports them and the peak
of live bytes for the graph's node order (inputs counted while they are used, outputs until
the end). ``recompute`` trades a little compute for memory the way activation checkpointing
does at op granularity: a saved value made by a cheap op (elementwise or data movement)
whose operands are kept anyway is computed again right before its first backward use, so the
forward copy dies at the end of the forward pass. ``recompute_layers`` does it by layer, as
Megatron-LM's activation recomputation does: ``full`` keeps only each layer's input and runs
the layer's forward again right before its backward; ``selective`` recomputes only each
layer's attention core. Every node made by recomputation carries ``Location.recompute``
(``recomputed_nodes``), so later passes and cost models can tell it from the model's own work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from ..ir.graph import Graph, Node, Value
from ..ir.layers import node_layer
from ..ir.types import Location
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


def recompute(graph: Graph, backward: "set[Node] | None" = None) -> int:
    """Recompute cheap saved values in the backward section; returns how many. In place.

    ``backward``: the backward section's nodes, for a graph without the seed's marker (a
    pipeline chunk's); default: from ``backward_start`` on. The clones are marked
    ``Location.recompute == "cheap"``."""
    if backward is None:
        start = backward_start(graph)
        if start is None:
            return 0
        in_bwd = _backward_set(graph, start)
    else:
        in_bwd = set(backward)
    count = 0
    changed = True
    while changed:
        changed = False
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
            clone = Node(p.op, list(p.operands), dict(p.attrs), [v.type], _marked(p, "cheap"), [None])
            graph.insert_before(first, clone)
            # The clone belongs to the backward section (else it would count as forward and
            # be "saved" and recomputed again, forever).
            in_bwd.add(clone)
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


# --- recomputation by layer -----------------------------------------------------------------

POLICIES = ("none", "cheap", "selective", "full")

# A module path component that names a layer's attention block (GPT-2 ``attn``, Llama
# ``self_attn``, BERT ``attention``).
_ATTENTION_SCOPE = re.compile(r"attn|attention", re.IGNORECASE)
# Fused attention ops whose backward op recomputes the scores from q, k, v and the saved
# row statistics (``attention_grad`` reads q, k, v, out, lse: the flash-attention backward),
# so they save nothing quadratic in the sequence: recomputing one would cost an attention
# forward to free only ``out`` and ``lse``, which grow linearly. Selective recomputation
# keeps their results.
_FUSED_ATTENTION = frozenset({"attention"})


def recompute_policy(value: object, what: str = "recompute") -> str:
    """``value`` as one of ``POLICIES``: False/None -> "none", True -> "cheap" (the op-level
    pass), or the policy's name."""
    if value is None or value is False:
        return "none"
    if value is True:
        return "cheap"
    if isinstance(value, str) and value in POLICIES:
        return value
    from ..ir.diagnostics import suggest
    from .grad import AutodiffError

    hint = suggest(value, POLICIES) if isinstance(value, str) else ""
    raise AutodiffError(f"{what}={value!r}{hint} is not a recomputation policy; use False or 'none' (keep every "
                        "activation), True or 'cheap' (recompute cheap elementwise values), 'selective' (the "
                        "attention core of each layer) or 'full' (each layer keeps only its input)")


def recomputed_nodes(graph: Graph) -> set[Node]:
    """The nodes of ``graph`` that recompute a forward value for the backward (any policy):
    those whose location has ``recompute`` set."""
    return {n for n in graph.nodes if n.loc is not None and n.loc.recompute}


def recompute_policy_of(graph: Graph) -> str:
    """The layer policy a graph's recomputed nodes were made with (``"full"`` or
    ``"selective"``), else ``"cheap"`` if it has cheap ones, else ``"none"``."""
    found = {n.loc.recompute for n in recomputed_nodes(graph) if n.loc is not None}
    for p in ("full", "selective", "cheap"):
        if p in found:
            return p
    return "none"


def _marked(node: Node, policy: str) -> Location:
    loc = node.loc or node.text_loc
    return replace(loc, recompute=policy) if loc is not None else Location("", 0, recompute=policy)


def _in_attention(node: Node, layer: str) -> bool:
    loc = node.loc
    if loc is None or not loc.scope.startswith(layer):
        return False
    return any(_ATTENTION_SCOPE.search(part) for part in loc.scope[len(layer):].split(".") if part)


def _replayable(node: Node) -> bool:
    """Whether running ``node`` again gives the same result: no effects, or a training
    dropout, whose mask is a hash of its seed and the element indices (computing it again
    draws the same mask, as Megatron-LM restores the RNG state for a recomputed layer)."""
    op = OPS.get(node.op)
    if op is None:
        return False
    effects = op.effects_of(node.attrs)
    return not effects or (node.op == "dropout" and effects == {"rng"})


def _recomputable(node: Node, layer: str, policy: str) -> bool:
    if not _replayable(node):
        return False
    if policy == "full":
        return True
    # Selective: the attention core, what lies between the q/k/v projections and the output
    # projection (it reads no param: the projections and their biases stay saved).
    return (_in_attention(node, layer) and node.op not in _FUSED_ATTENTION
            and not any(v.producer is None and v.role == "param" for v in node.operands))


def recompute_layers(graph: Graph, policy: str = "full", backward: "set[Node] | None" = None) -> int:
    """Recompute, per layer, the forward values the layer's backward reads; returns how many
    nodes were cloned. In place.

    A layer is found as the pipeline stage cut finds it (a module scope ending in a number,
    ``partita.ir.layers.node_layer``); the layer's backward is the backward nodes with that layer (each
    carries the location of the forward node it differentiates). For each layer, every value
    made by a recomputable forward node of the layer (``full``: any node without effects;
    ``selective``: the attention core) and read by the layer's backward is computed again:
    the cone of such nodes back to the values entering it (the layer's input activations,
    params, values of other layers, non-recomputable nodes' results, which stay saved) is
    cloned, in forward order, right before the first node of the layer's backward that reads
    one of them, and the layer's backward reads the clones. Other readers (the next layer's
    backward reading this layer's output, its input) keep the forward values. Clones are
    marked ``Location.recompute == policy``.

    ``backward``: the backward section's nodes (default: from ``backward_start`` on).
    """
    if policy not in ("full", "selective"):
        raise ValueError(f"recompute_layers: policy must be 'full' or 'selective', got {policy!r}")
    if backward is None:
        start = backward_start(graph)
        if start is None:
            return 0
        in_bwd = _backward_set(graph, start)
    else:
        in_bwd = set(backward)
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    layer_of = {n: node_layer(n) for n in nodes}
    layers: list[str] = []
    for n in nodes:
        lay = layer_of[n]
        if n not in in_bwd and lay and lay not in layers:
            layers.append(lay)
    count = 0
    for lay in layers:
        members = {n for n in nodes if n not in in_bwd and layer_of[n] == lay and _recomputable(n, lay, policy)}
        reads = [(u, i, v) for u in nodes if u in in_bwd and layer_of[u] == lay
                 for i, v in enumerate(u.operands) if v.producer in members]
        if not reads:
            continue
        cone: set[Node] = set()
        stack: list[Node | None] = [v.producer for _, _, v in reads]
        while stack:
            top = stack.pop()
            if top is None or top in cone or top not in members:
                continue
            cone.add(top)
            stack.extend(o.producer for o in top.operands)
        first = min((u for u, _, _ in reads), key=lambda u: pos[u])
        vmap: dict[Value, Value] = {}
        for n in sorted(cone, key=lambda x: pos[x]):
            m = Node(n.op, [vmap.get(o, o) for o in n.operands], dict(n.attrs), [r.type for r in n.results],
                     _marked(n, policy), [None] * len(n.results))
            graph.insert_before(first, m)
            in_bwd.add(m)
            for a, b in zip(n.results, m.results):
                vmap[a] = b
        for u, i, v in reads:
            graph.set_operand(u, i, vmap[v])
        count += len(cone)
    return count


def apply_recompute(graph: Graph, policy: object, backward: "set[Node] | None" = None) -> int:
    """Apply recomputation ``policy`` (see ``recompute_policy``) to a training graph in place;
    returns how many nodes it cloned. ``backward`` as for ``recompute_layers``."""
    p = recompute_policy(policy)
    if p == "none":
        return 0
    if p == "cheap":
        return recompute(graph, backward)
    return recompute_layers(graph, p, backward)


@register_pass
class Recompute(Pass):
    """Recompute forward values in the backward section instead of keeping them alive across
    it. ``policy=cheap`` (default): cheap values (elementwise and data-movement ops whose
    operands are kept anyway); ``selective``: each layer's attention core; ``full``: each
    layer keeps only its input; ``none``: nothing."""

    name = "recompute"

    @dataclass
    class Options:
        policy: Literal["none", "cheap", "selective", "full"] = "cheap"

    def run(self, graph: Graph) -> Graph:
        apply_recompute(graph, self.options.policy)
        return graph
