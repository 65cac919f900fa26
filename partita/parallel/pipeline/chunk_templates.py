"""Pricing a pipeline's section programs once per distinct section, across ranks and candidates.

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
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from ...ir.graph import Node, Value

# Attributes that name or address a node but do not change what the simulator makes of it:
# the transfers' peer and tag (the program reads them off the node itself), a value's name.
_NAMING_ATTRS = frozenset({"tag", "name", "peer"})
_DIGITS = re.compile(r"\d+")


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


__all__ = ["SectionCache", "active_section_cache", "node_value_map", "section_digest", "using_section_cache"]
