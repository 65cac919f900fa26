"""The single-device graph beside a rank's program: which per-rank node does what which
single-device node does, which the rewrite added (collectives, slices, pads), which changed
shape and which are gone.

The per-rank program renames values and resizes shapes, so nodes are matched by what they
are, not by name: their module (``Location.scope``), source line and op. Within that key the
two programs keep their order, so the match is an order-preserving alignment of the two key
sequences (the longest common blocks first), then the leftovers of each key paired in order
(a node the rewrite moved, e.g. a collective issued earlier).
"""

from __future__ import annotations

from collections import defaultdict
from difflib import SequenceMatcher
from typing import Any

from ..ir.graph import Graph, Node
from ..ops.kinds import COLLECTIVE_OPS, P2P_OPS

# Marks of a node in the comparison (the page's legend says the same).
SAME, ADDED, RESIZED, REMOVED = 0, 1, 2, 3
# What the parallel rewrite adds besides collectives: the pieces a rank takes and pads.
SLICE_OPS = frozenset({"shard_slice", "slice", "split", "concat", "axis_index", "pad", "dynamic_slice"})


def node_key(n: Node) -> tuple[str, str, int, str]:
    """What a node is, apart from its names and shapes: module, source file and line, op; a
    node without a location (an optimizer update) by the graph input it reads first (the
    per-rank program keeps the inputs' names)."""
    loc = n.loc
    if loc is not None:
        return (loc.scope, loc.file, loc.line, n.op)
    first = next((o.name for o in n.operands if o.producer is None and o.name), "")
    return ("", first or "", 0, n.op)


def fits(local: list[list[int]], single: list[list[int]]) -> bool:
    """Whether a rank's result shapes can be pieces of the single-device ones: as many
    results, of the same rank, each dimension at most the global one (a shard, or a
    padded shard no larger than twice it)."""
    if len(local) != len(single):
        return False
    return all(len(a) == len(b) and all(x <= 2 * y for x, y in zip(a, b)) for a, b in zip(local, single))


def match_nodes(single: Graph, local: Graph) -> list[int]:
    """For each node of ``local`` the index of the node of ``single`` it matches, or -1."""
    sn, ln = list(single.nodes), list(local.nodes)
    a, b = [node_key(n) for n in sn], [node_key(n) for n in ln]
    sa, sb = [shapes(n) for n in sn], [shapes(n) for n in ln]
    ids: dict[tuple, int] = {}
    ia = [ids.setdefault(k, len(ids)) for k in a]
    ib = [ids.setdefault(k, len(ids)) for k in b]
    match = [-1] * len(b)
    used = [False] * len(a)
    sm = SequenceMatcher(None, ia, ib, autojunk=False)
    for blk in sm.get_matching_blocks():
        for k in range(blk.size):
            if fits(sb[blk.b + k], sa[blk.a + k]):
                match[blk.b + k] = blk.a + k
                used[blk.a + k] = True
    left: dict[int, list[int]] = defaultdict(list)
    for i, k in enumerate(ia):
        if not used[i]:
            left[k].append(i)
    for k in left:
        left[k].reverse()
    for j, k in enumerate(ib):
        cand = left.get(k)
        if match[j] >= 0 or not cand:
            continue
        # the first leftover of the key (in program order) whose shapes fit, else the first
        pick = next((c for c in range(len(cand) - 1, -1, -1) if fits(sb[j], sa[cand[c]])), len(cand) - 1)
        i = cand.pop(pick)
        match[j] = i
        used[i] = True
    return match


def kind_added(op: str) -> str:
    """What an added node is for: a collective, a point-to-point transfer, a slice or pad, or
    other glue (a reshape, a cast)."""
    if op in COLLECTIVE_OPS:
        return "collective"
    if op in P2P_OPS:
        return "send/recv"
    if op in SLICE_OPS:
        return "slice/pad"
    return "other"


def shapes(n: Node) -> list[list[int]]:
    """The shapes of a node's results."""
    return [list(getattr(r.type, "shape", ()) or ()) for r in n.results]


def compare_json(single: Graph, local: Graph) -> dict[str, Any]:
    """The comparison the page draws: per local node its match in ``single`` (-1: added) and
    mark, per single-device node its match in ``local`` (-1: removed) and mark, counts."""
    sn, ln = list(single.nodes), list(local.nodes)
    match = match_nodes(single, local)
    back = [-1] * len(sn)
    for j, i in enumerate(match):
        if i >= 0 and back[i] < 0:
            back[i] = j
    lmark, gmark = [SAME] * len(ln), [SAME] * len(sn)
    counts: dict[str, int] = defaultdict(int)
    for j, i in enumerate(match):
        if i < 0:
            lmark[j] = ADDED
            counts["added " + kind_added(ln[j].op)] += 1
        elif shapes(ln[j]) != shapes(sn[i]):
            lmark[j] = gmark[i] = RESIZED
            counts["resized"] += 1
    for i, j in enumerate(back):
        if j < 0:
            gmark[i] = REMOVED
            counts["removed"] += 1
    return {"local_match": match, "global_match": back, "local_mark": lmark, "global_mark": gmark,
            "counts": dict(counts), "kinds": {op: kind_added(op) for op in {ln[j].op for j, i in enumerate(match) if i < 0}}}


__all__ = ["compare_json", "match_nodes", "node_key", "kind_added", "SAME", "ADDED", "RESIZED", "REMOVED"]
