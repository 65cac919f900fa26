"""A model of few layers for pricing: identical transformer layers price the same.

``truncate_layers(graph, keep)`` is ``graph`` with only its first ``keep`` repeated layers:
the nodes of the later layers are dropped, the values the last layer handed to the tail
(the final norm, the head, the loss) are taken from layer ``keep - 1`` instead, and the
dropped layers' params leave the inputs. The planner simulates each candidate on two such
models (one and two layers per pipeline chunk: the same pp, virtual stages, microbatches and
schedule) and extrapolates the step time linearly in layers per chunk to the real depth
(``scale``): per-layer compute and tp traffic, the bubble (a multiple of the per-chunk time)
and the dp gradient traffic (the parameters) all grow linearly with the layers a chunk holds.
docs/plan.md gives the error of the scaled figure against the full simulation.
"""

from __future__ import annotations

from ..ir import Graph
from ..ir.graph import Node, Value
from ..ir.layers import node_layer


def layer_spans(graph: Graph) -> tuple[list[str], dict[Node, int]]:
    """The layers in order and each node's layer index (-1: before the layers, len: after)."""
    layers: list[str] = []
    index: dict[str, int] = {}
    own: dict[Node, int | None] = {}
    for n in graph.nodes:
        lay = node_layer(n)
        if lay:
            if lay not in index:
                index[lay] = len(layers)
                layers.append(lay)
            own[n] = index[lay]
        else:
            own[n] = None
    where: dict[Node, int] = {}
    seen = -1
    for n in graph.nodes:
        k = own[n]
        if k is not None:
            seen = max(seen, k)
            where[n] = k
        else:
            # Outside every layer: with the layer it reads from, before the layers, or after them.
            prev = max((where[v.producer] for v in n.operands if v.producer is not None), default=-1)
            where[n] = len(layers) if prev >= len(layers) - 1 and seen >= len(layers) - 1 else prev
    return layers, where


def crossing(graph: Graph, where: dict[Node, int], lo: int, hi: int, reader_lo: int) -> list[Value]:
    """Values made by nodes in layers [lo, hi] and read by a node at layer ``reader_lo`` or later."""
    out: list[Value] = []
    for n in graph.nodes:
        if not lo <= where[n] <= hi:
            continue
        for r in n.results:
            if any(where[u] >= reader_lo and not lo <= where[u] <= hi for u in r.users) and r not in out:
                out.append(r)
    return out


def truncate_layers(graph: Graph, keep: int) -> Graph | None:
    """``graph`` with its first ``keep`` layers only, or None when its layers are not a plain chain."""
    layers, where0 = layer_spans(graph)
    n_layers = len(layers)
    if keep >= n_layers:
        return graph
    if keep < 1:
        return None
    g = graph.clone()
    _, where = layer_spans(g)
    # The chain: layer keep-1 hands layer keep what the last layer hands the tail.
    handed = crossing(g, where, keep - 1, keep - 1, keep)
    tail_in = crossing(g, where, keep, n_layers - 1, n_layers)
    if len(handed) != len(tail_in) or any(a.type != b.type for a, b in zip(handed, tail_in)):
        return None
    if any(where[v.producer] >= keep and where[v.producer] < n_layers for v in g.outputs if v.producer is not None):
        return None
    for old, new in zip(tail_in, handed):
        for user in list(old.users):
            if where[user] >= n_layers:
                for i, v in enumerate(user.operands):
                    if v is old:
                        g.set_operand(user, i, new)
    for n in list(g.reversed_nodes()):
        if keep <= where[n] < n_layers:
            if any(r.has_uses for r in n.results):
                return None
            g.erase(n)
    for v in list(g.inputs):
        if v.role == "param" and not v.has_uses:
            g.remove_input(v)
            if v.name is not None and v.name in g.weights:
                del g.weights[v.name]
    return g


def scale(t1: float, t2: float, per_chunk: float) -> float:
    """The figure at ``per_chunk`` layers a chunk from those at one (``t1``) and two (``t2``)."""
    return t1 + (t2 - t1) * (per_chunk - 1.0)
