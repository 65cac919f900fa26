"""The ``fuse-kernels`` pass: groups of elementwise ops become ``fused`` nodes.

What groups (the cost rule). An elementwise op written as its own ATen kernel reads its
operands from memory and writes its result back; in a chain of them every intermediate makes a
round trip through memory, which on this machine costs far more than the arithmetic (the
clamp-mul-add chain of docs/codegen-choice.md: 36 ATen kernels 13.7 ms, one fused loop 1.6 ms).
So a group is grown from a consumer towards its producers, and a producer joins when

1. it lowers (``lowering.supported``: the op and its dtypes have a kernel), and
2. its result has as many elements as the root's (reshapes between members are free: the kernel
   walks one flat index); a smaller value (a bias, a row of scales) is computed outside and
   read by the kernel through broadcast strides, never recomputed per element, and
3. either every user of its result is already in the group (the value disappears from memory),
   or it also becomes one of the kernel's outputs, which costs one store instead of a separate
   kernel's load and store, as long as the group stays convex (no path leaves the group and
   comes back; the pass checks) and no op with effects (a send, recv or collective) would have
   to move later for it.

Scalar fills and splat constants are copied into each group that reads them (they are
immediates in the kernel). Producers are taken latest first, so all users that could join a
group are considered before their producers. A group becomes a kernel only when it saves at
least one round trip: ``min_ops`` (default 2) compute ops; a lone op stays an ATen call, which
is as fast. (A view of a smaller value read only by the group joins it as an index map: the
kernel reads the value's memory in the view's shape, and the view is a step saved, counted
with the compute ops; ``absorb_views`` does the same for a view left in front of a fused node
made by an earlier run.) ``max_ops`` (default 96) bounds one kernel's compile time.

The pass runs on any graph, single-device or a per-rank program (collectives are not
elementwise, so they stay where they are). Every group's body is the group as a graph in
canonical text (see partita/codegen/op.py), checked by the reference interpreter like any pass.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..ir.dtypes import DType, f32
from ..ir.graph import Graph, Node, Value
from ..ir.printer import print_graph
from ..ops.registry import OPS
from ..passes.manager import Pass, register_pass
from .lowering import supported

__all__ = ["FuseKernels", "plan_groups", "Group", "absorb_views"]

_SPLATS = ("full", "constant")
_RESHAPES = ("reshape", "unsqueeze", "squeeze")   # the same elements in the same order
_FREE = ("broadcast_to",) + _RESHAPES


@dataclass
class Group:
    root: Node
    members: list[Node]          # in graph order, splat copies included
    inputs: list[Value]
    outputs: list[Value]

    @property
    def compute_ops(self) -> int:
        return sum(1 for n in self.members if n.op not in _SPLATS and n.op not in _FREE)

    @property
    def steps_saved(self) -> int:
        """The compute ops, and the views of smaller values taken as index maps (each a step
        that no longer runs)."""
        size = self.root.results[0].type.numel
        return self.compute_ops + sum(1 for n in self.members if n.op in _RESHAPES
                                      and n.results[0].type.numel != size)


def _fusible(n: Node, any_float: bool = False) -> bool:
    if len(n.results) != 1:
        return False
    opdef = OPS.get(n.op)
    if opdef is None or opdef.effects_of(n.attrs):
        return False
    if n.op in _SPLATS:
        r = n.results[0]
        if n.op == "full" and isinstance(n.attrs["value"], bool) and not r.type.dtype.is_bool:
            return False
        return supported(n.op, [], [r.type.dtype], n.attrs) is None
    if not (opdef.elementwise or n.op in _FREE):
        return False
    op = "reshape" if n.op in _RESHAPES else n.op   # body_of writes them as reshapes
    ins, outs = [v.type.dtype for v in n.operands], [n.results[0].type.dtype]
    if any_float:   # pricing only: bf16/f16 checked as f32 (a GPU's kernels take them)
        ins, outs = [_as_f32(d) for d in ins], [_as_f32(d) for d in outs]
    return supported(op, ins, outs, n.attrs) is None


def _as_f32(d: DType) -> DType:
    return f32 if d.name in ("bf16", "f16") else d


def _index_map(p: Node, members: set[Node]) -> bool:
    """``p`` reshapes (or unsqueezes, squeezes) a smaller value read only by the group: it joins
    as an index map, the kernel reading the value's memory in the new shape (lowering.py), so no
    step makes the view (a mask's unsqueezes before its arithmetic)."""
    r, q = p.results[0], p.operands[0].producer
    return (p.op in _RESHAPES and not r.is_output and all(u in members for u in r.users)
            and (q is None or q.op not in _SPLATS))


def plan_groups(graph: Graph, min_ops: int = 2, max_ops: int = 96, any_float: bool = False,
                segment: dict[Node, int] | None = None, min_reduction_ops: int | None = None) -> list[Group]:
    """The groups ``fuse-kernels`` makes of ``graph``, roots last first. For pricing only
    (partita/cluster/fused_groups.py): ``any_float``, bf16 and f16 pass the support check as
    f32; ``segment``, a group takes only ops of its root's segment. ``min_reduction_ops``
    (``min_ops`` where None): the fewest compute ops of a group rooted at a reduction."""
    red_min = min_ops if min_reduction_ops is None else min_reduction_ops
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    fusible = {n: _fusible(n, any_float) for n in nodes}
    taken: set[Node] = set()
    groups: list[Group] = []
    for red in reversed(nodes):
        g = _reduction_group(red, nodes, pos, fusible, taken, red_min, max_ops, segment)
        if g is not None:
            taken |= set(n for n in g.members if n.op not in _SPLATS)
            groups.append(g)
    for root in reversed(nodes):
        if root in taken or not fusible[root] or root.op in _SPLATS or root.op in _FREE:
            continue
        size = root.results[0].type.numel
        members: set[Node] = {root}
        splats: set[Node] = set()
        heap: list[int] = []
        for v in root.operands:
            if v.producer is not None:
                heapq.heappush(heap, -pos[v.producer])
        seen: set[Node] = set()
        while heap:
            p = nodes[-heapq.heappop(heap)]
            if p in seen or p in members or p in taken:
                continue
            seen.add(p)
            if not fusible[p]:
                continue
            r = p.results[0]
            if p.op in _SPLATS:
                splats.add(p)
                continue
            if len(members) >= max_ops or (segment is not None and segment[p] != segment[root]):
                continue
            if r.type.numel != size and not _index_map(p, members):
                continue  # a smaller value: computed outside, read through broadcast strides
            outside = [u for u in r.users if u not in members]
            if outside or r.is_output:
                if not _convex(nodes, pos, members, outside, pos[root]):
                    continue
            members.add(p)
            for v in p.operands:
                if v.producer is not None and v.producer not in members:
                    heapq.heappush(heap, -pos[v.producer])
        group_nodes = sorted(members | splats, key=pos.__getitem__)
        g = _make_group(root, group_nodes, members)
        if g.steps_saved < min_ops or not g.inputs:
            continue  # too small to pay, or constants only (fold-constants computes those)
        taken |= members
        groups.append(g)
    return groups


def _reduction_group(red: Node, nodes: list[Node], pos: dict[Node, int], fusible: dict[Node, bool],
                     taken: set[Node], min_ops: int, max_ops: int,
                     segment: dict[Node, int] | None = None) -> Group | None:
    """A row-reduction kernel around ``red`` (sum/mean/max/min over trailing axes): the
    elementwise prologue that only it reads, and the row-size elementwise ops after it
    (``rsqrt(mean + eps)``), each reading nothing made after the reduction but the chain."""
    from .lowering import REDUCTIONS, trailing_reduction

    if red.op not in REDUCTIONS or red in taken or len(red.results) != 1:
        return None
    x, r = red.operands[0], red.results[0]
    if not r.type.dtype.is_float or r.type.dtype.name not in ("f32", "f64") or x.type.numel == 0:
        return None
    if trailing_reduction(tuple(x.type.shape), red.attrs) is None:
        return None
    size = x.type.numel
    members: set[Node] = {red}
    splats: set[Node] = set()
    heap: list[int] = []
    if x.producer is not None:
        heapq.heappush(heap, -pos[x.producer])
    seen: set[Node] = set()
    while heap:
        p = nodes[-heapq.heappop(heap)]
        if p in seen or p in members or p in taken:
            continue
        seen.add(p)
        if not fusible[p]:
            continue
        if p.op in _SPLATS:
            splats.add(p)
            continue
        pr = p.results[0]
        if len(members) >= max_ops or pr.type.numel != size or pr.is_output or any(u not in members for u in pr.users) \
                or (segment is not None and segment[p] != segment[red]):
            continue  # the prologue is full size: a value read elsewhere stays outside
        members.add(p)
        for v in p.operands:
            if v.producer is not None and v.producer not in members:
                heapq.heappush(heap, -pos[v.producer])
    # the row epilogue
    cur = red
    while len(members) < max_ops:
        users = list(cur.results[0].users)
        if len(users) != 1:
            break
        u = users[0]
        if u in taken or not fusible[u] or u.op in _SPLATS or u.results[0].type.numel != r.type.numel \
                or (segment is not None and segment[u] != segment[red]):
            break
        ok = True
        for v in u.operands:
            if v is cur.results[0]:
                continue
            q = v.producer
            if q is None or q.op in _SPLATS or pos[q] < pos[red]:
                if q is not None and q.op in _SPLATS:
                    splats.add(q)
                continue
            ok = False
        if not ok:
            break
        members.add(u)
        cur = u
    group_nodes = sorted(members | splats, key=pos.__getitem__)
    g = _make_group(cur, group_nodes, members)
    if g.compute_ops < min_ops or not g.inputs:
        return None
    return g


def _convex(nodes: list[Node], pos: dict[Node, int], members: set[Node], outside: list[Node], limit: int) -> bool:
    """No path from the nodes ``outside`` (users of a candidate) reaches a member, and none of
    the nodes that the fused node's placement (at the root) would pull later has effects: a
    send, recv or collective must keep its place in the program (moving a send after a recv
    deadlocks a pipeline)."""
    stack = [u for u in outside if pos[u] < limit]
    seen: set[Node] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        opdef = OPS.get(n.op)
        if opdef is None or opdef.effects_of(n.attrs):
            return False
        for r in n.results:
            for u in r.users:
                if u in members:
                    return False
                if pos[u] < limit and u not in seen:
                    stack.append(u)
    return True


def _make_group(root: Node, group_nodes: list[Node], members: set[Node]) -> Group:
    inside = set(group_nodes)
    inputs: list[Value] = []
    seen: set[Value] = set()
    for n in group_nodes:
        for v in n.operands:
            if (v.producer is None or v.producer not in inside) and v not in seen:
                seen.add(v)
                inputs.append(v)
    outputs = []
    for n in group_nodes:
        if n not in members:
            continue
        r = n.results[0]
        if r.is_output or any(u not in inside for u in r.users) or n is root:
            outputs.append(r)
    return Group(root, group_nodes, inputs, outputs)


def body_of(group: Group) -> Graph:
    """The group as a graph of its own: the body of its ``fused`` node, canonically named."""
    body = Graph("kernel")
    env: dict[Value, Value] = {}
    for i, v in enumerate(group.inputs):
        env[v] = body.add_input(f"x{i}", v.type)
    for n in group.members:
        op, attrs = n.op, dict(n.attrs)
        if op in _RESHAPES:   # one op for every view that keeps the order of the elements
            op, attrs = "reshape", {"shape": tuple(n.results[0].type.shape)}
        new = Node(op, [env[v] for v in n.operands], attrs, [n.results[0].type])
        body.append(new)
        env[n.results[0]] = new.results[0]
    body.set_outputs([env[v] for v in group.outputs])
    return body


@register_pass
class FuseKernels(Pass):
    """Groups of elementwise ops (with broadcasts and scalar constants) become ``fused`` nodes,
    each run as one generated kernel (partita/codegen; the cost rule is in fusion.py)."""

    name = "fuse-kernels"

    @dataclass
    class Options:
        min_ops: int = 2
        max_ops: int = 96
        # the fewest compute ops of a group rooted at a reduction (0: ``min_ops``).
        # CompiledProgram's frozen default keeps 2, so a lone global mean stays the pool
        # kernel (codegen/pool.py) with its flatten folded in, not a one-op reduction kernel
        min_reduction_ops: int = 0

    def run(self, graph: Graph) -> Graph:
        groups = plan_groups(graph, self.options.min_ops, self.options.max_ops,
                             min_reduction_ops=self.options.min_reduction_ops or None)
        if not groups:
            absorb_views(graph)
            return graph
        # Bodies first: rewriting one group replaces values another group reads.
        texts = [print_graph(body_of(g)) for g in groups]
        repl: dict[Value, Value] = {}
        for g, text in zip(groups, texts):
            ins = [repl.get(v, v) for v in g.inputs]
            node = Node("fused", ins, {"body": text}, [v.type for v in g.outputs], g.root.loc)
            anchor = g.root
            for v in ins:
                if v.producer is not None and anchor.is_before(v.producer):
                    anchor = v.producer
            graph.insert_after(anchor, node)
            for old, new in zip(g.outputs, node.results):
                graph.replace_all_uses(old, new, check_order=False)
                repl[old] = new
            for n in reversed(g.members):
                if n.op in _SPLATS and any(u not in g.members for r in n.results for u in r.users):
                    continue  # a splat other nodes still read
                if not any(r.users or r.is_output for r in n.results):
                    graph.erase(n)
        absorb_views(graph)
        graph.topo_sort()
        return graph


def absorb_views(graph: Graph) -> int:
    """Reshapes, unsqueezes and squeezes read only by one ``fused`` node that has no reduction
    (one made by an earlier run of the pass, before other passes left a view in front of it)
    become the first op of its body: the kernel reads the view's operand (index maps, as
    ``plan_groups`` takes them), and the view's step goes (a chain of views, one by one).
    Returns how many went."""
    total = 0
    while True:
        count = _absorb_views_once(graph)
        total += count
        if not count:
            return total


def _absorb_views_once(graph: Graph) -> int:
    """One sweep of ``absorb_views``."""
    from .fused_body import body_graph
    from .lowering import REDUCTIONS

    count = 0
    for node in list(graph.nodes):
        if node.graph is not graph or node.op != "fused":
            continue
        take = {j for j, v in enumerate(node.operands)
                if v.producer is not None and v.producer.op in _RESHAPES and not v.is_output
                and list(v.users) == [node] and len(v.producer.operands) == 1}
        body = body_graph(node.attrs["body"])
        if not take or any(n.op in REDUCTIONS for n in body.nodes):
            continue
        views_of: dict[int, Node] = {}
        for j in take:
            p = node.operands[j].producer
            assert p is not None  # ``take`` holds only operands a view produces
            views_of[j] = p
        text = print_graph(_body_reading_sources(body, {j: p.operands[0] for j, p in views_of.items()}))
        ins = [views_of[j].operands[0] if j in views_of else v for j, v in enumerate(node.operands)]
        new = Node("fused", ins, {"body": text}, [r.type for r in node.results], node.loc)
        graph.insert_before(node, new)
        views = list(views_of.values())
        for old, r in zip(node.results, new.results):
            graph.replace_all_uses(old, r, check_order=False)
        graph.erase(node)
        for p in views:
            if not any(r.users or r.is_output for r in p.results):
                graph.erase(p)
                count += 1
    return count


def _body_reading_sources(body: Graph, sources: dict[int, Value]) -> Graph:
    """``body`` with each input ``j`` of ``sources`` taken in the source's type and reshaped to
    the input's type as its first op."""
    new = Graph("kernel")
    env: dict[Value, Value] = {}
    for i, x in enumerate(body.inputs):
        if i in sources:
            nx = new.add_input(f"x{i}", sources[i].type)
            view = Node("reshape", [nx], {"shape": tuple(x.type.shape)}, [x.type])
            new.append(view)
            env[x] = view.results[0]
        else:
            env[x] = new.add_input(f"x{i}", x.type)
    for n in body.nodes:
        copy = Node(n.op, [env[v] for v in n.operands], dict(n.attrs), [n.results[0].type])
        new.append(copy)
        env[n.results[0]] = copy.results[0]
    new.set_outputs([env[v] for v in body.outputs])
    return new
