"""Per-chunk templates: a pipeline's alike chunks built once, and its section programs priced
once per distinct section, across ranks and candidates.

``chunk_programs``: the chunk programs of a pipeline (each chunk's forward and its backward
derived again, stage_graphs.py), built once per distinct chunk (first, middle, last: keyed by
``chunk_digest``, the chunk's structure but for its layers' names) and copied into every
alike chunk with the names of its params and the scopes of its layers (``copy_chunk_program``);
the copies print as the chunk built on its own would.

A pipeline built with ``unroll=False`` keeps one local template per pp rank; the section
simulator (``partita/cluster/pipeline_sim.py``) turns each section of each template (a
chunk's F, B or W, a transfer, the optimizer) into a priced *fragment*. Most sections are
alike but for names: the middle chunks of one rank, every middle rank's copy of them, and the
same chunk in another candidate with the same layers a chunk, tp, microbatch rows and
recomputation (the dp size changes only the group of the dp collectives, whose times the
simulator takes from the mesh, not from the template). Here a section is keyed by its
structure (``section_digest``: ops, attributes but for names, tags and peers, types, operands
by position, where its values are read), and a fragment built once is handed to every alike
section with its nodes and values mapped over (``pipeline_sim`` does the mapping).

``SectionCache``: what the planner's ``Pricer`` keeps across the candidates of a planning run
(the compute ops' prices and the fragments, per cluster); ``using_section_cache`` makes one
the cache of every section-level simulation inside its ``with`` block. Without one, each
simulation keeps its own (alike sections within one candidate are still built once).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from ...ir.graph import Graph, Node, Value, bulk_build, input_name
from ...ir.location import Location
from .stage_graphs import ChunkProgram, build_chunk_program
from .stages import Chunk

# Attributes that name or address a node but do not change what the simulator makes of it:
# the transfers' peer and tag (the program reads them off the node itself), a value's name.
_NAMING_ATTRS = frozenset({"tag", "name", "peer"})
_DIGITS = re.compile(r"\d+")
# Attributes that differ from layer to layer in alike chunks: a random op's seed (dropout's).
# A copy maps each of the first chunk's seeds to the alike chunk's (copy_chunk_program).
_PER_LAYER_ATTRS = frozenset({"seed"})


@dataclass
class SectionCache:
    """Per cluster (by identity): the priced compute ops (``price_key`` -> price) and the
    section fragments (``section_digest`` -> (fragment, its nodes)); ``hits`` and ``built``
    count the fragments handed over and those built."""

    clusters: dict[int, tuple[Any, dict, dict]] = field(default_factory=dict)
    hits: int = 0
    built: int = 0

    def for_cluster(self, cluster: Any) -> tuple[dict, dict]:
        """(priced ops, fragments) of ``cluster``, empty at first."""
        got = self.clusters.get(id(cluster))
        if got is None or got[0] is not cluster:
            got = self.clusters[id(cluster)] = (cluster, {}, {})
        return got[1], got[2]


_ACTIVE: contextvars.ContextVar[SectionCache | None] = contextvars.ContextVar("section_cache", default=None)


@contextlib.contextmanager
def using_section_cache(cache: SectionCache) -> Iterator[SectionCache]:
    """Make ``cache`` the section cache of the section-level simulations inside the block."""
    if not isinstance(cache, SectionCache):
        raise TypeError(f"using_section_cache: expected a SectionCache, got {type(cache).__name__}; "
                        "make one with SectionCache()")
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)


def active_section_cache() -> SectionCache | None:
    """The section cache of the enclosing ``using_section_cache`` block, if any."""
    return _ACTIVE.get()


def _attr_part(a: str, v: Any) -> Any:
    if a in _NAMING_ATTRS:
        return None
    if a == "group_size" and isinstance(v, int):
        return v > 1                    # the group's size is the mesh's; only whether it talks matters
    return _DIGITS.sub("#", repr(v)) if isinstance(v, str) else repr(v)


def section_digest(nodes: list[Node], outputs: set[Value], overlap: bool) -> tuple:
    """What a section's fragment depends on, but for names, tags, peers, layer and chunk
    indices and the dp group's size: for each node its op, attributes, result types, operands
    (a position inside the section, else the outside value's type and producer's op), whether
    its results are read outside the section or are program outputs, and its location with
    digits hidden; ``overlap``: the fragment's ordering option."""
    inside = {n: i for i, n in enumerate(nodes)}
    parts: list[Any] = [overlap]
    for n in nodes:
        ops: list[Any] = []
        for v in n.operands:
            p = v.producer
            if p is not None and p in inside:
                ops.append((inside[p], p.results.index(v) if len(p.results) > 1 else 0))
            else:
                ops.append((str(v.type), p.op if p is not None else None,
                            p is not None and p.attrs.get("group_size", 1) > 1))
        res = tuple((str(r.type), r in outputs, any(u not in inside for u in r.users)) for r in n.results)
        attrs = tuple(sorted((a, _attr_part(a, v)) for a, v in n.attrs.items()))
        parts.append((n.op, attrs, tuple(ops), res, _DIGITS.sub("#", repr(n.loc))))
    return tuple(parts)


def node_value_map(proto: list[Node], nodes: list[Node]) -> tuple[dict[Node, Node], dict[Value, Value]]:
    """The nodes and values of section ``proto`` to those of the alike section ``nodes`` (same
    digest): nodes by position, their results and operands by position."""
    nmap = dict(zip(proto, nodes))
    vmap: dict[Value, Value] = {}
    for p, n in nmap.items():
        vmap.update(zip(p.results, n.results))
        vmap.update(zip(p.operands, n.operands))
    return nmap, vmap


def _scoped(loc: Any) -> Any:
    """``loc`` with the digits of its scope hidden (the layers' indices)."""
    if isinstance(loc, Location):
        return dataclasses.replace(loc, scope=_DIGITS.sub("#", loc.scope))
    return loc


def chunk_digest(ch: Chunk, last: bool) -> tuple:
    """What a chunk's program depends on but for its layers' names: its received, sent, batch
    and param values (types; the batch inputs by name), each node's op, attributes, operands
    by position and result count, its location with the scope's digits hidden, and whether it
    is the last chunk."""
    idx: dict[Value, tuple] = {}
    parts: list[Any] = [last, len(ch.layers)]
    for what, vals in (("recv", ch.recv), ("batch", ch.batch), ("param", ch.params)):
        for i, v in enumerate(vals):
            idx[v] = (what, i)
        parts.append(tuple((str(v.type), v.role, str(v.name) if what == "batch" else None) for v in vals))
    for k, n in enumerate(ch.nodes):
        ops = tuple(idx.get(o, ("?", str(o.type))) for o in n.operands)
        attrs = sorted((a, None if a in _PER_LAYER_ATTRS else v) for a, v in n.attrs.items())
        parts.append((n.op, repr(attrs), ops, tuple(str(r.type) for r in n.results), _scoped(n.loc)))
        for j, r in enumerate(n.results):
            idx[r] = (k, j)
    parts.append(tuple(idx.get(v) for v in ch.send))
    parts.append(tuple(idx.get(v) for v in ch.recomputed))
    return tuple(parts)


def copy_chunk_program(proto: ChunkProgram, proto_chunk: Chunk, chunk: Chunk) -> ChunkProgram | None:
    """``proto`` (the program of ``proto_chunk``) for the alike ``chunk`` (same ``chunk_digest``):
    its params named as ``chunk``'s, its locations' scopes those of ``chunk``'s layers. None
    when the two chunks' nodes do not map one to one (then build it)."""
    scopes: dict[str, str] = {}
    per_layer: dict[tuple[str, Any], Any] = {}
    for a, b in zip(proto_chunk.nodes, chunk.nodes):
        sa = a.loc.scope if isinstance(a.loc, Location) else ""
        sb = b.loc.scope if isinstance(b.loc, Location) else ""
        if scopes.setdefault(sa, sb) != sb:
            return None
        for k in _PER_LAYER_ATTRS & a.attrs.keys():
            if per_layer.setdefault((k, a.attrs[k]), b.attrs[k]) != b.attrs[k]:
                return None
    names = {str(a.name): str(b.name) for a, b in zip(proto_chunk.params, chunk.params)}
    if len(set(names.values())) != len(names):
        return None

    def loc(x: Any) -> Any:
        if isinstance(x, Location) and x.scope in scopes and scopes[x.scope] != x.scope:
            return dataclasses.replace(x, scope=scopes[x.scope])
        return x

    src = proto.graph
    g = Graph(f"chunk{chunk.index}")
    g.loc, g.mesh = src.loc, src.mesh
    g.weights = type(src.weights)(dict(src.weights))
    vmap: dict[Value, Value] = {}
    nmap: dict[Node, Node] = {}
    with bulk_build():
        for v in src.inputs:
            role = v.role
            assert role is not None, "add_input gives every input a role"
            nm = input_name(v)
            w = vmap[v] = g.add_input(names.get(nm, nm), v.type, role)
            w.placement = v.placement
        append = g._append_unchecked
        for n in src.nodes:
            attrs = dict(n.attrs)
            for k in _PER_LAYER_ATTRS & attrs.keys():
                if (k, attrs[k]) not in per_layer:
                    return None         # a seed the forward does not have: not sure what it stands for
                attrs[k] = per_layer[(k, attrs[k])]
            m = Node(n.op, [vmap[v] for v in n.operands], attrs, [r.type for r in n.results], loc(n.loc),
                     [names.get(r.name, r.name) if r.name is not None else None for r in n.results])
            m._text_loc = loc(n._text_loc) if isinstance(n._text_loc, Location) else n._text_loc
            append(m)
            nmap[n] = m
            for r, q in zip(n.results, m.results):
                vmap[r] = q
                q.placement = r.placement
        g.set_outputs([vmap[v] for v in src.outputs],
                      [None if x is None else vmap[x] for x in src.output_aliases] or None)

    def val(x: Value | None) -> Value | None:
        return vmap[x] if x is not None else None

    return ChunkProgram(chunk.index, g, [vmap[v] for v in proto.recv], [vmap[v] for v in proto.send],
                        {k: vmap[v] for k, v in proto.batch.items()},
                        {names.get(k, k): vmap[v] for k, v in proto.params.items()},
                        [val(c) for c in proto.cotangents], val(proto.loss), [val(x) for x in proto.recv_grads],
                        {names.get(k, k): vmap[v] for k, v in proto.param_grads.items()},
                        [nmap[n] for n in proto.F], [nmap[n] for n in proto.B], [nmap[n] for n in proto.W],
                        proto.forward_only, [vmap[v] for v in proto.final])


def chunk_programs(chunks: list[Chunk], loss: Value | None, *, forward_only: bool, outputs: list[Value] | None,
                   recompute: str | tuple[str, ...], digests: list[tuple] | None = None) -> list[ChunkProgram]:
    """The program of every chunk (``build_chunk_program``; the last takes ``loss`` and
    ``outputs``), built once per distinct chunk and copied into the alike ones; ``recompute``:
    one policy, or one per chunk; ``digests`` (a list) receives each chunk's ``chunk_digest``
    (with its policy where chunks differ) in order."""
    last = chunks[-1].index if chunks else -1
    made: dict[tuple, tuple[ChunkProgram, Chunk]] = {}
    out: list[ChunkProgram] = []
    for ch in chunks:
        i = ch.index
        policy = recompute if isinstance(recompute, str) else recompute[i]
        key = chunk_digest(ch, i == last) + ((policy,) if not isinstance(recompute, str) else ())
        if digests is not None:
            digests.append(key)
        got = made.get(key)
        cp = copy_chunk_program(got[0], got[1], ch) if got is not None else None
        if cp is None:
            cp = build_chunk_program(ch, i == last, loss if i == last else None, forward_only=forward_only,
                                     outputs=None if i != last else outputs, recompute=policy)
            made.setdefault(key, (cp, ch))
        out.append(cp)
    return out


__all__ = ["SectionCache", "chunk_digest", "chunk_programs", "copy_chunk_program", "active_section_cache", "node_value_map", "section_digest", "using_section_cache"]
