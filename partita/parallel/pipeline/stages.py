"""``partition-stages``: cut a forward graph into contiguous model chunks.

A chunk is a contiguous range of the graph's topological order, cut only between the layers
a user recognizes: a layer is a module path ending in a number (``transformer.h.3``), read
from each node's source scope (``Location.scope``, which the torch frontend records) or, for
a node without one, from the params it reads (``transformer.h.3.mlp.c_fc.weight``). Nodes
before the first layer (the embeddings) join the first chunk; nodes after the last (the
final norm, the head, the loss) join the last.

The cut is chosen to balance the chunks' work (the op records' FLOPs plus bytes moved, the
bytes weighted as ``BYTE_FLOPS`` FLOPs each), ties broken by parameter and activation
memory; or the user names it: ``stages=["h.3", "h.7"]`` (the layers each later chunk starts
at) or ``stages=[3, 3, 2]`` (layers per chunk).

Every value a chunk reads from an earlier one crosses the cut: it is sent forward, and its
gradient sent back, unless it is computed from the batch inputs, the model's buffers and
constants alone (a causal mask, position ids, rotary tables): then the later chunk recomputes
it, since sending it would also send back a gradient nothing needs, summed over every
microbatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ...ir.graph import Graph, Node, Value
from ...ir.layers import layer_of_path, node_layer
from ...ops.registry import OPS
from .schedule import PipelineError

# One byte moved counts as this many FLOPs of work (a machine balance of about ten FLOPs per
# byte of memory traffic): what the stage balance compares.
BYTE_FLOPS = 10


def node_work(node: Node) -> float:
    """The node's work in FLOPs, with bytes moved counted as ``BYTE_FLOPS`` each."""
    op = OPS.get(node.op)
    if op is None:
        return 0.0
    try:
        c = op.cost_of([v.type for v in node.operands], [r.type for r in node.results], node.attrs)
    except Exception:  # a cost rule that cannot price this instance counts nothing
        return 0.0
    return float(c.flops) + BYTE_FLOPS * float(c.bytes_read + c.bytes_written)


def nbytes(v: Value) -> int:
    return v.type.nbytes


@dataclass
class Chunk:
    """One model chunk: its nodes (in order, recomputed ones included), the layers it holds,
    the values it receives from the chunk before (``recv``) and sends to the next (``send``),
    in the order they travel, the batch inputs and params it reads."""

    index: int
    layers: list[str]
    nodes: list[Node]
    recv: list[Value] = field(default_factory=list)
    send: list[Value] = field(default_factory=list)
    batch: list[Value] = field(default_factory=list)
    params: list[Value] = field(default_factory=list)
    recomputed: list[Value] = field(default_factory=list)
    work: float = 0.0
    param_bytes: int = 0
    activation_bytes: int = 0


@dataclass
class StageCut:
    """The chunks of a forward graph, and why the cut is where it is."""

    graph: Graph
    chunks: list[Chunk]
    layers: list[str]
    how: str

    def text(self) -> str:
        lines = [f"{len(self.chunks)} chunk(s) of {len(self.layers)} layers ({self.how}):"]
        for c in self.chunks:
            span = f"{c.layers[0]} .. {c.layers[-1]}" if len(c.layers) > 1 else c.layers[0]
            lines.append(f"  chunk {c.index}: {len(c.layers)} layer(s) {span}, {len(c.nodes)} nodes, "
                         f"{c.work / 1e6:.1f} MFLOP-equivalent, params {c.param_bytes} B; receives "
                         f"{len(c.recv)} value(s), sends {len(c.send)}"
                         + (f", recomputes {len(c.recomputed)}" if c.recomputed else ""))
        return "\n".join(lines)


def _short(layer: str) -> str:
    """``lm.transformer.h.3`` -> ``h.3``: the last two components, as a user names it."""
    parts = layer.split(".")
    return ".".join(parts[-2:]) if len(parts) >= 2 else layer


def partition_stages(graph: Graph, chunks: int, stages: Sequence[str] | Sequence[int] | None = None, *,
                     virtual: int = 1) -> StageCut:
    """Cut the forward ``graph`` (its nodes in order; not changed) into ``chunks`` chunks
    (``virtual`` of them per pp rank: only for the messages)."""
    if isinstance(stages, (str, bytes)):
        raise PipelineError(f"pipeline: stages={stages!r} is one string; give a list: stages=[{stages!r}] (the "
                            "layers later stages start at) or layer counts per stage such as stages=[2, 2]")
    nodes = list(graph.nodes)
    raw = {n: node_layer(n) for n in nodes}
    layers: list[str] = []
    for n in nodes:
        lay = raw[n]
        if lay and lay not in layers:
            layers.append(lay)
    index = {lay: i for i, lay in enumerate(layers)}
    check_chunks(graph, layers, chunks, virtual)
    # Each node's effective layer: its own, never before its operands' (so that sorting by it
    # keeps the order topological); nodes outside the layers go with what they read.
    # A node outside the layers that reads only graph inputs and other such nodes (an
    # embedding, a weight transposed for the head, a mask from constants) floats: it goes
    # with its first reader, so a weight read by the head is read on the head's chunk.
    floating: set[Node] = set()
    for n in nodes:
        if raw[n] in (None, "") and all(v.producer is None or v.producer in floating for v in n.operands):
            floating.add(n)
    eff: dict[Node, int] = {}
    for n in nodes:
        if n in floating:
            continue
        own = index.get(raw[n] or "", -1)
        prev = max((eff[v.producer] for v in n.operands if v.producer is not None and v.producer in eff), default=0)
        eff[n] = max(own, prev, 0)
    outs = {v.producer for v in graph.outputs if v.producer is not None}
    for n in reversed(nodes):
        if n not in floating:
            continue
        readers = [eff[u] for r in n.results for u in r.users if u in eff]
        eff[n] = min(readers) if readers else (len(layers) - 1 if n in outs or not layers else 0)
    # A floating node placed late may now come after a non-floating reader's own operands
    # only: readers are never earlier than it (min over readers), so the order stays valid.
    order = sorted(range(len(nodes)), key=lambda i: (eff[nodes[i]], i))
    nodes = [nodes[i] for i in order]
    work = [0.0] * len(layers)
    mem = [0] * len(layers)
    seen_params: set[Value] = set()
    for n in nodes:
        k = eff[n]
        work[k] += node_work(n)
        mem[k] += sum(nbytes(r) for r in n.results)
        for v in n.operands:
            if v.producer is None and v.role == "param" and v not in seen_params:
                seen_params.add(v)
                mem[k] += nbytes(v)
    bounds, how = _cut(layers, work, mem, chunks, stages)
    chunk_of_layer = [0] * len(layers)
    for c in range(chunks):
        for k in range(bounds[c], bounds[c + 1]):
            chunk_of_layer[k] = c
    home = {n: chunk_of_layer[eff[n]] for n in nodes}
    return _build_chunks(graph, nodes, home, layers, bounds, work, how)


def graph_layers(graph: Graph) -> list[str]:
    """The layers of ``graph`` in the order its nodes first reach them (node_layer)."""
    seen: dict[str, None] = {}
    for n in graph.nodes:
        lay = node_layer(n)
        if lay:
            seen.setdefault(lay, None)
    return list(seen)


def check_chunks(graph: Graph, layers: list[str], chunks: int, virtual: int = 1) -> None:
    """A PipelineError unless ``layers`` (of ``graph``) are enough to cut ``chunks`` chunks
    (``virtual`` per pp rank: only for the message)."""
    if len(layers) < chunks:
        found = f"{len(layers)} ({', '.join(_short(x) for x in layers[:6])}{', ...' if len(layers) > 6 else ''})" \
            if layers else "none"
        asked = f"{chunks} chunk(s) asked for" + (
            f" ({chunks // virtual} pp ranks x virtual_stages={virtual})" if virtual > 1 else "")
        if virtual > 1:
            fix = (f"use pp ranks x virtual_stages <= {max(len(layers), 1)} (e.g. virtual_stages="
                   f"{max(len(layers) // max(chunks // virtual, 1), 1)}), or a model with more layers")
        else:
            fix = f"use at most {max(len(layers), 1)} pipeline stages, or a model with more layers"
        raise PipelineError(
            f"pipeline: {asked}, but @{graph.name} has {found} layers to cut between (a layer is a module path ending "
            "in a number, such as transformer.h.3, from the nodes' source scopes or the params' names); " + fix)


def _cut(layers: list[str], work: list[float], mem: list[int], chunks: int,
         stages: Sequence[str] | Sequence[int] | None) -> tuple[list[int], str]:
    """The first layer index of each chunk, plus the end: ``[0, b1, ..., L]``."""
    L = len(layers)
    if stages is None:
        return _balanced(work, mem, chunks), "balanced by work"
    st: list[Any] = list(stages)
    if all(isinstance(s, int) and not isinstance(s, bool) for s in st):
        if len(st) != chunks or any(s < 1 for s in st) or sum(st) != L:
            raise PipelineError(f"pipeline: stages={st} gives layers per chunk, so it needs {chunks} positive "
                                f"counts that sum to the model's {L} layers; e.g. stages={_even(L, chunks)}")
        b = [0]
        for s in st:
            b.append(b[-1] + s)
        return b, f"layers per chunk {st}"
    if all(isinstance(s, str) for s in st):
        if len(st) != chunks - 1:
            raise PipelineError(f"pipeline: stages={st} names {len(st)} cut point(s), but {chunks} chunks need "
                                f"{chunks - 1}: the layer each chunk after the first starts at, e.g. "
                                f"stages={[_short(layers[i]) for i in _balanced(work, mem, chunks)[1:-1]]}")
        b = [0]
        for s in st:
            hits = [i for i, lay in enumerate(layers) if lay == s or lay.endswith("." + s)]
            if not hits:
                import difflib

                near = difflib.get_close_matches(s, [_short(x) for x in layers], n=3)
                raise PipelineError(f"pipeline: the cut point '{s}' names no layer of the model"
                                    + (f" (did you mean {', '.join(near)}?)" if near else "")
                                    + f"; its layers are {_short(layers[0])} .. {_short(layers[-1])}")
            if len(hits) > 1:
                raise PipelineError(f"pipeline: the cut point '{s}' matches {len(hits)} layers "
                                    f"({', '.join(layers[i] for i in hits[:4])}); give more of the path")
            if hits[0] <= b[-1]:
                raise PipelineError(f"pipeline: the cut points {st} are not in increasing layer order, or one cuts "
                                    f"before the first layer; '{s}' is layer {hits[0]}")
            b.append(hits[0])
        b.append(L)
        return b, f"cut at {', '.join(st)}"
    raise PipelineError(f"pipeline: stages must be a list of layer names to cut at (['h.3', 'h.7']) or of layer "
                        f"counts per chunk ([3, 3, 2]); got {stages!r}")


def _even(L: int, k: int) -> list[int]:
    return [L // k + (1 if i < L % k else 0) for i in range(k)]


def _balanced(work: list[float], mem: list[int], k: int) -> list[int]:
    """Contiguous groups of layers minimizing the largest group's work (then memory): the
    linear partition problem, by dynamic programming over prefix sums."""
    L = len(work)
    pw = [0.0]
    pm = [0]
    for w, m in zip(work, mem):
        pw.append(pw[-1] + w)
        pm.append(pm[-1] + m)
    INF = (float("inf"), float("inf"))
    # best[j][i]: (max work, max mem) of the first i layers in j groups; arg: where the last starts.
    best = [[INF] * (L + 1) for _ in range(k + 1)]
    arg = [[0] * (L + 1) for _ in range(k + 1)]
    best[0][0] = (0.0, 0)
    for j in range(1, k + 1):
        for i in range(j, L - (k - j) + 1):
            for s in range(j - 1, i):
                prev = best[j - 1][s]
                if prev == INF:
                    continue
                cand = (max(prev[0], pw[i] - pw[s]), max(prev[1], pm[i] - pm[s]))
                if cand < best[j][i]:
                    best[j][i], arg[j][i] = cand, s
    b = [L]
    i = L
    for j in range(k, 0, -1):
        i = arg[j][i]
        b.append(i)
    return b[::-1]


def _inputs_only(v: Value, memo: dict[Value, bool]) -> bool:
    """Whether ``v`` is computed from batch inputs, buffers and constants alone (no param)."""
    if v in memo:
        return memo[v]
    stack = [v]
    ok = True
    seen: set[Value] = set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x in memo:
            ok = ok and memo[x]
            continue
        if x.producer is None:
            # The batch inputs and the model's buffers (role "state": the forward only reads
            # them; every stage that needs one takes it as an input) are free to read again.
            if x.role not in ("input", "state"):
                ok = False
                break
            continue
        stack.extend(x.producer.operands)
    memo[v] = ok
    return ok


def value_cone(values: Sequence[Value]) -> set[Node]:
    """The nodes ``values`` are computed from."""
    out: set[Node] = set()
    stack = list(values)
    while stack:
        n = stack.pop().producer
        if n is None or n in out:
            continue
        out.add(n)
        stack.extend(n.operands)
    return out


def _at(pos: dict[Node, int], v: Value) -> tuple[int, int]:
    """Where a node's result ``v`` is made: (its producer's position, its index)."""
    assert v.producer is not None
    return pos[v.producer], v.index


def _build_chunks(graph: Graph, nodes: list[Node], home: dict[Node, int], layers: list[str], bounds: list[int],
                  work: list[float], how: str) -> StageCut:
    k = len(bounds) - 1
    pos = {n: i for i, n in enumerate(nodes)}
    members: list[list[Node]] = [[] for _ in range(k)]
    for n in nodes:
        members[home[n]].append(n)
    memo: dict[Value, bool] = {}
    # Values read by a later chunk than their producer's: recompute or send.
    recompute: list[dict[Value, set[Node]]] = [{} for _ in range(k)]
    sent_from: dict[Value, int] = {}
    last_use: dict[Value, int] = {}
    for n in nodes:
        c = home[n]
        for v in n.operands:
            if v.producer is None:
                continue
            src = home[v.producer]
            if src >= c:
                continue
            if _inputs_only(v, memo):
                # Always recomputed: a sent value would also get its gradient sent back and
                # summed over dp and tp every microbatch (a rotary table: 64 small latency-bound
                # collectives a rank at Llama 3 405B's scale), though nothing needs that
                # gradient; its cone is computed from shapes, buffers and batch inputs alone.
                recompute[c][v] = value_cone([v])
                continue
            sent_from[v] = src
            last_use[v] = max(last_use.get(v, 0), c)
    for v in graph.outputs:
        if v.producer is not None and home[v.producer] < k - 1 and v not in sent_from:
            sent_from[v] = home[v.producer]
            last_use[v] = k - 1
    chunks: list[Chunk] = []
    for c in range(k):
        own = set(members[c])
        extra: set[Node] = set()
        for cone in recompute[c].values():
            extra.update(x for x in cone if x not in own)
        body = sorted(own | extra, key=lambda n: pos[n])
        # What crosses into this chunk from the one before: values produced earlier and read
        # here or later (passed through), in a fixed order (by producer position).
        recv = sorted((v for v, s in sent_from.items() if s < c <= last_use[v]), key=lambda v: _at(pos, v))
        send = sorted((v for v, s in sent_from.items() if s <= c < last_use[v]), key=lambda v: _at(pos, v))
        batch: list[Value] = []
        params: list[Value] = []
        seen: set[Value] = set()
        for n in body:
            for v in n.operands:
                if v.producer is None and v not in seen:
                    seen.add(v)
                    (params if v.role != "input" else batch).append(v)
        ch = Chunk(c, layers[bounds[c]:bounds[c + 1]], body, recv, send, batch, params,
                   sorted(recompute[c], key=lambda v: _at(pos, v)))
        ch.work = sum(node_work(n) for n in body)
        ch.param_bytes = sum(nbytes(p) for p in params)
        ch.activation_bytes = sum(nbytes(r) for n in members[c] for r in n.results)
        chunks.append(ch)
    return StageCut(graph, chunks, layers, how)


__all__ = ["BYTE_FLOPS", "Chunk", "StageCut", "layer_of_path", "node_layer", "node_work", "partition_stages", "value_cone", "graph_layers", "check_chunks"]
