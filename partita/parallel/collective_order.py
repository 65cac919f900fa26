"""One collective order for per-rank (partitioned) graphs: what the ``order-collectives``
pass does (partita/parallel/bucket.py) and what the section-level simulator
(partita/cluster/pipeline_sim.py) re-derives for each section of a pipeline template, from
the same functions:

- ``order_collectives(graph, prefetch, keep_order)`` fixes one order of the collectives that
  depends only on the program, never on the order its nodes happened to be inserted in:
  every rank that builds the same program (or its own stage of it) derives the same
  sequence, so no group waits in one collective while a member waits in another;
- ``kept_order(nodes)``: the order ``keep_order=True`` gives (before any prefetch), each
  collective hoisted to just after what it needs and each all_gather sunk to just before its
  first reader, with each collective's anchor (``KeptOrder``); the simulator calls it on a
  section's nodes;
- ``check_collective_order`` is the static check of that property over the per-rank graphs
  of an MPMD program.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..ir.attrs import DenseAttr
from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph, Node, Value
from ..ir.mesh import Mesh, MeshError
from ..ir.printer import format_attr
from ..ops.collective import is_point_to_point
from ..ops.kinds import STRIDED_VIEW_OPS, VIEW_OPS
from ..ops.registry import OPS
from .interpreter import describe_collective, first_disagreement, nth, pair_point_to_point


class CollectiveOrderError(PartitaError):
    """Per-rank programs whose members of one group would issue different collectives at
    the same position: a real run would hang or mix up data there."""


def effect_chain(nodes: list[Node]) -> dict[Node, Node]:
    """Each effectful node that is not a collective, mapped to the previous such node: their
    relative order is kept by every reordering here (an RNG stream, I/O)."""
    prev: Node | None = None
    chain: dict[Node, Node] = {}
    for n in nodes:
        op = OPS.get(n.op)
        if op is None or op.collective is not None or not op.effects_of(n.attrs):
            continue
        if prev is not None:
            chain[n] = prev
        prev = n
    return chain


def apply_order(graph: Graph, schedule: list[Node]) -> None:
    """Relink ``graph``'s nodes into ``schedule`` (a valid order of the same nodes), moving
    only the nodes that are out of place."""
    cur = graph.first
    for n in schedule:
        if n is cur:
            cur = cur.next
        else:
            assert cur is not None, "the schedule lists more nodes than the graph has"
            graph.move_before(cur, n)
    graph.renumber()



def grows_when_gathered(n: Node) -> bool:
    """A collective whose result is larger than its operand (all_gather): issued long before
    it is read, it holds the larger tensor all that time (a zero3 param from the step's
    start), so it is ordered by when it is needed, and issued just in time, or ``prefetch``
    gathers ahead (``order_collectives``)."""
    op = OPS.get(n.op)
    return (op is not None and op.collective is not None and len(n.operands) == 1
            and sum(r.type.nbytes for r in n.results) > n.operands[0].type.nbytes)


def is_collective(n: Node) -> bool:
    """Whether ``n`` is a collective (send and recv, point-to-point, are not)."""
    op = OPS.get(n.op)
    return op is not None and op.collective is not None


def _attr_text(v: Any) -> str:
    if isinstance(v, DenseAttr):
        s = v.splat_array()
        if s is not None:  # by its one value: a splat's array may be too large to build
            return f"dense<{s.dtype.str}{list(v.shape)}:splat:{s.tobytes().hex()}>"
        a = v.array
        return f"dense<{a.dtype.str}{list(a.shape)}:{hashlib.sha1(a.tobytes()).hexdigest()}>"
    if isinstance(v, tuple):
        return "(" + ",".join(_attr_text(x) for x in v) + ")"
    return format_attr(v)


def _signatures(graph: Graph, nodes: list[Node]) -> dict[Node, str]:
    """A digest of what each node computes from the graph inputs: its op, attributes, result
    types and its operands' digests. It ignores node order, object ids and printed numbers,
    so two builds of one program give every node the same digest on every rank."""
    vsig: dict[Value, str] = {v: f"in{v.index}:{v.name}:{v.type}" for v in graph.inputs}
    sig: dict[Node, str] = {}
    for n in nodes:
        h = hashlib.sha1(n.op.encode())
        for k in sorted(n.attrs):
            h.update(f"|{k}={_attr_text(n.attrs[k])}".encode())
        for v in n.operands:
            h.update(f"|<{vsig[v]}".encode())
        for r in n.results:
            h.update(f"|>{r.type}".encode())
        s = sig[n] = h.hexdigest()
        for r in n.results:
            vsig[r] = f"{s}.{r.index}"
    return sig


def order_collectives(graph: Graph, prefetch: int = 1, keep_order: bool = False,
                      overlap_backward: bool = True) -> list[Node]:
    """Re-sort the nodes of ``graph`` (in place) so that its collectives come in one order
    that depends only on the program; returns the collective nodes in that order.

    ``keep_order``: the program's order is already the one to keep (a pipeline rank's
    program, whose compute follows the schedule, and whose dp/tp peers run the very same
    program): the collectives keep their relative order and only move up, each to just after
    the last node it needs, and every other node keeps its place (see ``kept_order``).
    Ordering by readiness would interleave microbatches: a later microbatch's forward (ready
    early, and needed by its own collectives) would run before the backward the schedule puts
    first, and the pipeline would stall on every microbatch.

    The collectives are ordered first by how early their operands can be ready (the longest
    chain of nodes from the graph inputs; for an all_gather, how early its result is read),
    then by axis, op and a digest of what they compute; a collective that depends on another
    always comes after it. Each is issued as early as its operands allow: only the nodes it
    needs (and have not run yet) go before it; an all_gather then sinks to just before its
    first reader, short of the next collective. The other nodes keep their relative order,
    as do effectful non-collective nodes.

    ``overlap_backward``: each tensor-parallel linear layer's backward is then ordered so that
    its collectives overlap its matmuls (``overlap_linear_backward``); a pipeline whose weight
    gradients are deferred (zero-bubble's W sections) passes False, its weight gradients stay
    where the schedule puts them.

    ``prefetch``: an all_gather of a graph input (a zero3 param) is then moved up to just
    after the gather ``prefetch`` places before it among those, so that it is in flight
    (the runtime starts it asynchronously and waits where it is read) while the previous
    params are used, as FSDP prefetches the next all-gather; each rank then holds up to
    ``prefetch`` more gathered params. 0: just in time.
    """
    if prefetch < 0:
        raise CollectiveOrderError(f"order-collectives: prefetch must be 0 (just in time) or more gathers "
                                   f"ahead, got {prefetch}")
    nodes = list(graph.nodes)
    if keep_order:
        order = kept_order(nodes, overlap_backward).nodes
        if prefetch:
            order = _prefetch_gathers(order, prefetch)
        apply_order(graph, order)
        return [n for n in order if is_collective(n)]

    pos = {n: i for i, n in enumerate(nodes)}
    deps = order_dependencies(nodes)

    depth: dict[Node, int] = {}
    for n in nodes:
        depth[n] = 1 + max((depth[p] for p in deps(n)), default=0)
    sig = _signatures(graph, nodes)
    colls = [n for n in nodes if is_collective(n)]

    # As late as possible: the longest chain to the end, counted back from the deepest node,
    # so a value's "latest" level is just before that of its earliest needed reader.
    last = max(depth.values(), default=0)
    latest: dict[Node, int] = {}
    for n in reversed(nodes):
        readers = [u for r in n.results for u in r.users]
        latest[n] = min((latest[u] - 1 for u in readers), default=last)

    def when(n: Node) -> int:
        # An all_gather's result is bigger than its operand: issued early it holds the
        # gathered tensor longer (a zero3 param from the step's start). It is ordered by when
        # it is needed; ``prefetch`` then starts it that many gathers ahead, and the runtime
        # (TorchProgram(overlap=True)) runs it asynchronously until its first reader.
        return max(depth[n], latest[n]) if grows_when_gathered(n) else depth[n]

    def key(n: Node) -> tuple:
        # Identical digests compute identical values, so their relative order cannot change
        # what any rank sees; the node position only makes the sort total.
        return (when(n), n.attrs.get("axis", ""), n.op, sig[n], pos[n])

    # Kahn's algorithm over the collectives, the smallest key first among the ready ones: a
    # collective is ready once the collectives it needs are issued, which is once its nearest
    # ones are (those reached without passing another collective; they need the rest). Each
    # key is computed once, so this is O(C log C), not O(C^2) rescans of the pending list.
    near: dict[Node, frozenset[Node]] = {}
    cset = set(colls)
    for n in nodes:
        acc: set[Node] = set()
        for d in deps(n):
            if d in cset:
                acc.add(d)
            else:
                acc |= near[d]
        near[n] = frozenset(acc)
    waiting = {c: len(near[c]) for c in colls}
    after: dict[Node, list[Node]] = {c: [] for c in colls}
    for c in colls:
        for d in near[c]:
            after[d].append(c)
    keys = {c: key(c) for c in colls}
    heap = [(keys[c], pos[c], c) for c in colls if waiting[c] == 0]
    heapq.heapify(heap)
    sequence: list[Node] = []
    while heap:
        _, _, c = heapq.heappop(heap)
        sequence.append(c)
        for u in after[c]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(heap, (keys[u], pos[u], u))
    assert len(sequence) == len(colls), "the collectives' dependencies have a cycle"

    schedule: list[Node] = []
    placed: set[Node] = set()
    for c in sequence:
        wanted: list[Node] = []
        stack = [c]
        while stack:
            n = stack.pop()
            if n in placed:
                continue
            placed.add(n)
            wanted.append(n)
            stack.extend(deps(n))
        wanted.sort(key=pos.__getitem__)
        schedule.extend(wanted)
    schedule.extend(n for n in nodes if n not in placed)
    order = sink_gathers(schedule)
    if overlap_backward:
        order = overlap_linear_backward(order)
    if prefetch:
        order = _prefetch_gathers(order, prefetch)
    apply_order(graph, order)
    return [n for n in order if is_collective(n)]


@dataclass(frozen=True)
class KeptOrder:
    """What ``kept_order`` gives: ``nodes`` in their new order, and each collective's
    ``anchors``: the position (in the nodes as given) of the node it comes right after, -1
    when it comes before them all."""

    nodes: list[Node]
    anchors: dict[Node, int]

    def anchor_node(self, given: list[Node], n: Node) -> Node | None:
        """The node of ``given`` (the nodes ``kept_order`` was given) that collective ``n``
        comes right after; None when it comes first."""
        a = self.anchors[n]
        return given[a] if a >= 0 else None


def order_dependencies(nodes: list[Node]) -> Callable[[Node], list[Node]]:
    """What each of ``nodes`` must come after when they are reordered: the producers of its
    operands among ``nodes``, and the effectful node before it (``effect_chain``)."""
    inside = set(nodes)
    chain = effect_chain(nodes)

    def deps(n: Node) -> list[Node]:
        ds = [v.producer for v in n.operands if v.producer is not None and v.producer in inside]
        if n in chain:
            ds.append(chain[n])
        return ds

    return deps


def kept_order(nodes: list[Node], overlap_backward: bool = False) -> KeptOrder:
    """``nodes`` in the order ``order_collectives(keep_order=True)`` gives them before any
    prefetch: each collective hoisted to just after what it needs among ``nodes`` and the
    collective before it (``hoist_collectives``), then each all_gather sunk to just before its
    first reader or the next collective (``sink_gathers``), and with ``overlap_backward`` each
    linear layer's backward ordered to overlap its collectives (``overlap_linear_backward``).
    ``nodes`` may be a part of a program (a pipeline template's section, pipeline_sim.py): what
    it needs from outside does not hold it back."""
    pos = {n: i for i, n in enumerate(nodes)}
    anchors = collective_anchors(nodes, pos, order_dependencies(nodes))
    order = sink_gathers(hoist_collectives(nodes, anchors))
    return KeptOrder(overlap_linear_backward(order) if overlap_backward else order, anchors)


def collective_anchors(nodes: list[Node], pos: dict[Node, int],
                       deps: Callable[[Node], list[Node]]) -> dict[Node, int]:
    """Each collective of ``nodes`` to its anchor, the position of the node it comes right
    after when it moves up (-1: before them all): the latest of its non-collective
    dependencies, its collective dependencies' anchors and the previous collective's anchor
    (the collectives keep their order). O(N)."""
    anchor: dict[Node, int] = {}
    last = -1
    for n in nodes:
        if not is_collective(n):
            continue
        a = last
        for d in deps(n):
            a = max(a, anchor[d] if d in anchor else pos[d])
        anchor[n] = last = a
    return anchor


def hoist_collectives(nodes: list[Node], anchors: dict[Node, int]) -> list[Node]:
    """``nodes`` with each collective moved up to just after its anchor
    (``collective_anchors``); every other node keeps its place. Every reader of a collective
    came after it, so after its anchor: the order stays valid."""
    after: dict[int, list[Node]] = defaultdict(list)
    for n, a in anchors.items():
        after[a].append(n)
    out: list[Node] = list(after.get(-1, ()))
    for i, n in enumerate(nodes):
        if n in anchors:
            continue
        out.append(n)
        out.extend(after.get(i, ()))
    return out


def sink_gathers(schedule: list[Node]) -> list[Node]:
    """Move each all_gather down to just before the first node that reads it, or the next
    collective if that comes first (the collectives keep their order): a gathered tensor is
    then alive only while it is used."""
    order = list(schedule)
    for c in [n for n in reversed(order) if grows_when_gathered(n)]:
        i = order.index(c)
        readers = {u for r in c.results for u in r.users}
        j = i + 1
        while j < len(order) and order[j] not in readers and not is_collective(order[j]):
            j += 1
        if j > i + 1:
            order.insert(j - 1, order.pop(i))
    return order


# Views in any layout and the strided ones (partita/ops/kinds.py): a zero3 gather's operand is
# a view of the param however it is laid out.
_VIEWS = VIEW_OPS | STRIDED_VIEW_OPS
# The collectives a linear layer's backward issues on its input gradient (tp's all_reduce,
# sequence parallelism's reduce_scatter): asynchronous in the runtime, so the weight gradient's
# matmul can run while they are in flight.
_INPUT_GRAD_COLLECTIVES = frozenset({"all_reduce", "reduce_scatter"})
# How many nodes after an input-gradient matmul its collective may come (the q, k and v
# input gradients summed and reshaped first).
_FEED_WINDOW = 12


def view_source(v: Value) -> Value:
    """The value ``v`` is a view of (through any chain of views), or ``v`` itself."""
    while v.producer is not None and v.producer.op in _VIEWS and v.producer.operands:
        v = v.producer.operands[0]
    return v


def view_readers(v: Value) -> list[Node]:
    """The nodes that read ``v`` or a view of it, other than views."""
    out: list[Node] = []
    stack = [v]
    while stack:
        x = stack.pop()
        for u in x.users:
            if u.op in _VIEWS:
                stack.extend(u.results)
            else:
                out.append(u)
    return out


def feeding_collective(m: Node, pos: dict[Node, int]) -> Node | None:
    """The input-gradient collective (``_INPUT_GRAD_COLLECTIVES``) that matmul ``m``'s result
    reaches within ``_FEED_WINDOW`` nodes of ``m`` without passing another collective, or None."""
    stack, seen = [m], {m}
    while stack:
        n = stack.pop()
        for r in n.results:
            for u in r.users:
                if u in seen or u not in pos or pos[u] - pos[m] > _FEED_WINDOW:
                    continue
                seen.add(u)
                if u.op in _INPUT_GRAD_COLLECTIVES:
                    return u
                if not is_collective(u):
                    stack.append(u)
    return None


def _moved_operands(w: Node, pos: dict[Node, int], before: int, m: Node,
                    taken: set[Node]) -> tuple[list[Node], list[Node]] | None:
    """What must move with matmul ``w`` when it goes to position ``before``: its operands' view
    chains placed after that (moved along, before it), and the all_gathers among its operands
    placed after it that ``m`` does not read (moved, with their operand views, to just before
    ``m``). None when an operand is computed after ``before`` otherwise."""
    chain: list[Node] = []
    gathers: list[Node] = []
    stack = [v.producer for v in w.operands if v.producer is not None]
    while stack:
        p = stack.pop()
        if p in taken or p in chain or p in gathers or pos.get(p, -1) < before:
            continue
        if p.op in _VIEWS:
            chain.append(p)
            stack.extend(v.producer for v in p.operands if v.producer is not None)
        elif grows_when_gathered(p) and m not in {u for r in p.results for u in r.users}:
            cone = input_chain(p, pos, pos[m])
            if cone is None:
                return None
            gathers.extend(cone)
        else:
            return None
    return sorted(chain, key=pos.__getitem__), sorted(gathers, key=pos.__getitem__)


def input_chain(g: Node, pos: dict[Node, int], before: int) -> list[Node] | None:
    """All_gather ``g`` and the views between it and a value computed before position
    ``before``; None when its operand is computed later."""
    out = [g]
    stack = [v.producer for v in g.operands if v.producer is not None]
    while stack:
        p = stack.pop()
        if pos.get(p, -1) < before:
            continue
        if p.op not in _VIEWS:
            return None
        out.append(p)
        stack.extend(v.producer for v in p.operands if v.producer is not None)
    return out


def overlap_linear_backward(order: list[Node]) -> list[Node]:
    """A linear layer's backward in the order that overlaps its collectives, as Megatron-LM's
    tensor-parallel layers do: for an input-gradient matmul ``m`` whose result goes to an
    all_reduce or reduce_scatter (``feeding_collective``), each weight-gradient matmul that
    reads the same incoming gradient (a sibling, placed after that collective's first reader)
    moves to just before that reader, so it runs while the collective is in flight; an
    all_gather it reads that ``m`` does not (sequence parallelism's re-gather of the layer's
    input) moves to just before ``m``, so it is in flight while ``m`` computes. Nodes only
    move up; the result is checked to be a valid order (else ``order`` is returned). In a
    pipeline whose W sections follow their B sections (every schedule but zero-bubble's), the
    weight gradients move into the B section: the section-level simulator orders a B section
    with its W section as one (pipeline_sim.py)."""
    pos = {n: i for i, n in enumerate(order)}
    before: dict[Node, list[Node]] = defaultdict(list)
    taken: set[Node] = set()
    for m in order:
        if m.op != "matmul" or m in taken:
            continue
        r = feeding_collective(m, pos)
        readers = [u for x in r.results for u in x.users if u in pos] if r is not None else []
        if not readers:
            continue
        reader = min(readers, key=pos.__getitem__)
        for s in dict.fromkeys(view_source(v) for v in m.operands):
            if s.producer is None:
                continue  # a graph input (a weight): its other readers are other layers'
            for w in view_readers(s):
                if w is m or w.op != "matmul" or w in taken or pos.get(w, -1) <= pos[reader]:
                    continue
                moved = _moved_operands(w, pos, pos[reader], m, taken)
                if moved is None:
                    continue
                chain, gathers = moved
                before[m].extend(gathers)
                before[reader].extend(chain + [w])
                taken.update(gathers, chain, [w])
    if not taken:
        return order
    out: list[Node] = []
    for n in order:
        if n in taken:
            continue
        out.extend(before.get(n, ()))
        out.append(n)
    return out if len(out) == len(order) and valid_order(out) else order


def valid_order(order: list[Node]) -> bool:
    """Whether every node of ``order`` comes after the producers of its operands among them."""
    inside = set(order)
    seen: set[Node] = set()
    for n in order:
        for v in n.operands:
            if v.producer is not None and v.producer in inside and v.producer not in seen:
                return False
        seen.add(n)
    return True


def input_cone(n: Node) -> list[Node] | None:
    """The nodes between the graph inputs and all_gather ``n`` when they only view and join
    them (zero3's gathered copy is a reshape of the param; a gather bucket concatenates such
    views), in program order; None when the operand is computed."""
    cone: dict[Node, None] = {}
    stack = [v.producer for v in n.operands if v.producer is not None]
    while stack:
        p = stack.pop()
        if p in cone:
            continue
        if p.op not in _VIEWS and p.op != "concat":
            return None
        cone[p] = None
        stack.extend(v.producer for v in p.operands if v.producer is not None)
    return sorted(cone, key=lambda x: x._order)


def _prefetch_gathers(order: list[Node], ahead: int) -> list[Node]:
    """Move each all_gather of a graph input (a param, or a view of one) up to just before
    the first reader of the gather ``ahead`` places before it among those (never above the
    gather just before it): the gathers keep their relative order, and each is in flight
    while the earlier params are read. Its view nodes move with it. Every rank runs the same
    program, so the collective order stays one order."""
    order = list(order)
    gathers: list[tuple[Node, list[Node]]] = []
    for n in order:
        if grows_when_gathered(n):
            chain = input_cone(n)
            if chain is not None:
                gathers.append((n, chain))
    for k in range(ahead, len(gathers)):
        g, chain = gathers[k]
        pos = {n: i for i, n in enumerate(order)}
        earlier = gathers[k - ahead][0]
        readers = [u for r in earlier.results for u in r.users]
        if not readers:
            continue
        # Just before the first reader of the gather `ahead` back, and after the one before.
        target = min(pos[u] for u in readers)
        target = max(target, pos[gathers[k - 1][0]] + 1)
        if pos[g] <= target:
            continue
        moved = sorted((n for n in chain if pos[n] >= target), key=pos.__getitem__) + [g]
        gone = set(moved)
        before = [n for n in order[:target] if n not in gone]
        after = [n for n in order[target:] if n not in gone]
        order = before + moved + after
    return order


def check_collective_order(graphs: Graph | Sequence[Graph], mesh: Mesh | str) -> None:
    """Check statically that the per-rank ``graphs`` (one per rank of ``mesh``, or one graph
    every rank runs) issue, along each mesh axis, the same sequence of collectives (op,
    attributes, local operand types) on every member of every group.

    Point-to-point ``send``/``recv`` take no part in a group's sequence; they are checked
    pairwise instead: the k-th send from rank s to rank d must meet the k-th recv on d from
    s, with the same type (``simulate.pair_point_to_point``).

    Raises CollectiveOrderError naming the two ranks, the position along the axis and both
    nodes at the first disagreement (what ``run_mesh`` would find at run time).
    """
    mesh = Mesh.of(mesh)
    gs = [graphs] * mesh.size if isinstance(graphs, Graph) else list(graphs)
    if len(gs) != mesh.size:
        raise CollectiveOrderError(f"check_collective_order: {len(gs)} per-rank graphs for the {mesh.size} ranks of "
                                   f"{mesh}; give one graph per rank (row-major rank order), or a single graph")
    seqs: list[list[Node]] = []
    for r, g in enumerate(gs):
        for n in g.nodes:
            p2p = is_point_to_point(n)
            if not (p2p or is_collective(n)):
                continue
            axis, size = n.attrs["axis"], n.attrs["group_size"]
            try:
                real = mesh.axis_size(axis)
            except MeshError:
                raise CollectiveOrderError(f"rank {r} (@{g.name}): {describe_collective(n)} is a "
                                           f"{'point-to-point op' if p2p else 'collective'} over axis "
                                           f"'{axis}', which {mesh} does not have (its axes: "
                                           f"{', '.join(mesh.names)})") from None
            if real != size:
                raise CollectiveOrderError(f"rank {r} (@{g.name}): {describe_collective(n)} says group_size={size}, but axis "
                                           f"'{axis}' of {mesh} has {real} ranks; set group_size={real}")
        seqs.append([n for n in g.nodes if is_collective(n)])
    for axis in mesh.names:
        found = first_disagreement([[n for n in seq if n.attrs["axis"] == axis] for seq in seqs], mesh, axis)
        if found is not None:
            group, first, m, k, na, nb = found
            raise CollectiveOrderError(
                f"ranks {first} and {m} (group {group} of axis '{axis}') disagree at their "
                f"{nth(k + 1)} collective over '{axis}' (position {k}): rank {first} issues "
                f"{describe_collective(na)}, rank {m} issues {describe_collective(nb)}; a real run would hang or mix up "
                f"data there. Run order-collectives on every rank's program, or make the ranks issue "
                f"the same collectives over '{axis}' in the same order")
    pair_point_to_point(gs, mesh, CollectiveOrderError)


__all__ = ["CollectiveOrderError", "KeptOrder", "apply_order", "check_collective_order", "collective_anchors",
           "effect_chain", "grows_when_gathered", "hoist_collectives", "input_cone", "is_collective", "kept_order",
           "order_collectives", "order_dependencies", "overlap_linear_backward", "sink_gathers",
           "valid_order", "view_readers", "view_source"]
