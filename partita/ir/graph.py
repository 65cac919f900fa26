"""The SSA graph: ``Value``, ``Node`` and ``Graph``.

Invariants every edit keeps (and checks):
- each Value is defined once: by a graph input or by exactly one Node result;
- ``value.users`` counts exactly the uses of the value by nodes in the graph;
- nodes sit in a doubly linked list in a valid topological order: every operand is defined
  before the node that uses it. Order numbers with gaps make "is a before b" O(1).
"""

from __future__ import annotations

import gc
import math
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from .diagnostics import GraphEditError
from .types import Location, TensorType
from .weights import Weights

if TYPE_CHECKING:  # the IR's records of meshes and placements (graph.mesh, value.placement)
    from .mesh import Mesh
    from .placement import Placement

ROLES = ("input", "param", "state")
_GAP = 1 << 20


@contextmanager
def bulk_build():
    """Pause the cyclic garbage collector while building many IR objects at once.

    Nodes and values point at each other, so every one is tracked by the collector, and
    its full collections rescan the whole growing graph: half the time of a large parse.
    Garbage cycles made meanwhile are collected by the next full collection.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            # Hand the objects made meanwhile straight to the oldest generation: freeze then
            # unfreeze moves every tracked object there without a scan. Without this, the
            # first young collection after the build scans the whole new graph (a third of a
            # large parse). The objects stay collectable: full collections still see them.
            # Skipped when the program froze objects of its own, which unfreeze would release.
            gc.freeze()
            gc.unfreeze()
        gc.enable()


class Value:
    """An SSA value: a graph input (with a role) or the result of one node.

    ``placement`` says how the value is laid out over the graph's mesh (None: not placed,
    as in every graph before parallelization).
    """

    __slots__ = ("type", "name", "producer", "index", "role", "graph", "users", "_out_uses", "placement",
                 "__weakref__")

    def __init__(self, type: TensorType, name: str | None = None, producer: "Node | None" = None,
                 index: int = 0, role: str | None = None) -> None:
        self.type = type
        self.name = name
        self.producer = producer
        self.index = index
        self.role = role
        self.graph: Graph | None = None
        self.users: dict[Node, int] = {}
        self._out_uses = 0
        self.placement: Placement | None = None

    @property
    def is_input(self) -> bool:
        return self.producer is None

    @property
    def num_uses(self) -> int:
        return sum(self.users.values()) + self._out_uses

    @property
    def has_uses(self) -> bool:
        return bool(self.users) or self._out_uses > 0

    @property
    def is_output(self) -> bool:
        return self._out_uses > 0

    def __repr__(self) -> str:
        return f"%{self.name if self.name is not None else '?'}: {self.type}"


def input_name(v: Value) -> str:
    """The name of graph input ``v``. ``Graph.add_input`` refuses an input without a name;
    only node results go unnamed (until printed), so ``Value.name`` stays optional."""
    name = v.name
    assert name is not None, f"graph input {v!r} has no name"
    return name


class Node:
    """One op application: operands in, results out, typed attributes, a source location."""

    __slots__ = ("op", "operands", "attrs", "results", "loc", "_text_loc", "graph",
                 "_prev", "_next", "_order", "__weakref__")

    def __init__(self, op: str, operands: Iterable[Value], attrs: dict[str, Any] | None,
                 result_types: Iterable[TensorType], loc: Location | None = None,
                 result_names: Iterable[str | None] | None = None) -> None:
        self.op = op
        self.operands: list[Value] = list(operands)
        self.attrs: dict[str, Any] = attrs if attrs is not None else {}
        if result_names is None:
            self.results: list[Value] = [Value(t, None, self, i) for i, t in enumerate(result_types)]
        else:
            names = list(result_names)
            self.results = [Value(t, names[i] if i < len(names) else None, self, i)
                            for i, t in enumerate(result_types)]
        self.loc = loc              # where the op came from in the model's source
        self._text_loc: Location | tuple | None = None
        self.graph: Graph | None = None
        self._prev: Node | None = None
        self._next: Node | None = None
        self._order = 0

    @classmethod
    def _build(cls, op: str, operands: list[Value], attrs: dict[str, Any], result_types,
               loc: Location | None, result_names: list[str], text_pos: tuple) -> "Node":
        """The parser's constructor: takes ownership of its lists and a lazy text location."""
        node = cls.__new__(cls)
        node.op = op
        node.operands = operands
        node.attrs = attrs
        if len(result_types) == 1:
            node.results = [Value(result_types[0], result_names[0], node, 0)]
        else:
            node.results = [Value(t, nm, node, i) for i, (t, nm) in enumerate(zip(result_types, result_names))]
        node.loc = loc
        node._text_loc = text_pos
        node.graph = None
        node._prev = node._next = None
        node._order = 0
        return node

    @property
    def text_loc(self) -> Location | None:
        """Where the node was parsed from (file, line, column of the op name), if it was."""
        t = self._text_loc
        if isinstance(t, tuple):  # (file, line, col) kept by the parser; built on first use
            t = self._text_loc = Location(*t)
        return t

    @text_loc.setter
    def text_loc(self, loc: Location | None) -> None:
        self._text_loc = loc

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise GraphEditError(f"{self.op} has {len(self.results)} results; use .results")
        return self.results[0]

    @property
    def prev(self) -> "Node | None":
        return self._prev if self.graph is not None else None

    @property
    def next(self) -> "Node | None":
        return self._next if self.graph is not None else None

    def is_before(self, other: "Node") -> bool:
        return self._order < other._order

    def __repr__(self) -> str:
        res = ", ".join(repr(r) for r in self.results)
        return f"<Node {self.op} -> {res}>"


class Graph:
    """A function: inputs with roles, nodes in topological order, outputs, and weights."""

    def __init__(self, name: str = "main") -> None:
        self.name = name
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        # Per output: the input whose buffer it may reuse (a new version of a param or
        # state, e.g. an optimizer's updated weight), or None.
        self.output_aliases: list[Value | None] = []
        self.weights = Weights()
        self.loc: Location | None = None
        # The device mesh the values' placements refer to (None: a single-device graph).
        self.mesh: Mesh | None = None
        self._head: Node | None = None
        self._tail: Node | None = None
        self._count = 0

    # --- iteration --------------------------------------------------------------------
    @property
    def nodes(self) -> Iterator[Node]:
        """Nodes in order; safe against erasing the node being visited or nodes after it.

        The successor is taken before the visit, so nodes inserted right after the visited
        node are not visited. An erased node keeps its old links, which is how the walk
        skips forward past nodes erased during the visit.
        """
        n = self._head
        while n is not None:
            nxt = n._next
            yield n
            while nxt is not None and nxt.graph is not self:
                nxt = nxt._next
            n = nxt

    def reversed_nodes(self) -> Iterator[Node]:
        """Nodes in reverse order, with the same guarantees as ``nodes``."""
        n = self._tail
        while n is not None:
            prv = n._prev
            yield n
            while prv is not None and prv.graph is not self:
                prv = prv._prev
            n = prv

    def __len__(self) -> int:
        return self._count

    @property
    def first(self) -> Node | None:
        return self._head

    @property
    def last(self) -> Node | None:
        return self._tail

    def values(self) -> Iterator[Value]:
        yield from self.inputs
        for n in self.nodes:
            yield from n.results

    # --- inputs and outputs -------------------------------------------------------------
    def add_input(self, name: str, type: TensorType, role: str = "input") -> Value:
        """Append an input of ``role`` named ``name``: inputs are always named, since
        callers bind arrays to them by name."""
        if not isinstance(name, str):
            raise GraphEditError(f"input name must be a string, got {name!r}")
        if role not in ROLES:
            raise GraphEditError(f"input role must be one of {', '.join(ROLES)}, got '{role}'")
        v = Value(type, name, None, len(self.inputs), role)
        v.graph = self
        self.inputs.append(v)
        return v

    def remove_input(self, v: Value) -> None:
        """Drop graph input ``v``, which nothing may use any more (its weight, if any, stays
        in ``weights`` for the caller to drop)."""
        self._check_owned(v, "the removed input")
        if not v.is_input:
            raise GraphEditError(f"{v!r} is a node result, not a graph input")
        if v.has_uses:
            raise GraphEditError(f"cannot remove input {v!r}: it still has {v.num_uses} use(s)")
        self.inputs.remove(v)
        for i, w in enumerate(self.inputs):
            w.index = i
        v.graph = None

    def input(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        raise KeyError(name)

    def params(self) -> list[Value]:
        return [v for v in self.inputs if v.role == "param"]

    def set_outputs(self, values: Iterable[Value], aliases: Iterable[Value | None] | None = None) -> None:
        """Set the outputs; ``aliases`` gives, per output, the input whose buffer it may
        reuse (None: no alias). Without ``aliases`` no output aliases an input."""
        values = list(values)
        for v in values:
            self._check_owned(v, "an output")
        al: list[Value | None] = [None] * len(values) if aliases is None else list(aliases)
        if len(al) != len(values):
            raise GraphEditError(f"set_outputs: {len(values)} output(s) but {len(al)} alias entries")
        seen: set[Value] = set()
        for v, a in zip(values, al):
            if a is None:
                continue
            if not a.is_input or a.graph is not self:
                raise GraphEditError(f"output {v!r} may only alias an input of @{self.name}, not {a!r}")
            if a.type != v.type:
                raise GraphEditError(f"output {v!r} ({v.type}) cannot alias input {a!r} ({a.type}): types differ")
            if a in seen:
                raise GraphEditError(f"two outputs alias the same input {a!r}")
            seen.add(a)
        for v in self.outputs:
            v._out_uses -= 1
        self.outputs = values
        self.output_aliases = al
        for v in values:
            v._out_uses += 1

    def output_alias(self, i: int) -> "Value | None":
        """The input output ``i`` may reuse the buffer of, or None."""
        return self.output_aliases[i] if i < len(self.output_aliases) else None

    # --- node edits ---------------------------------------------------------------------
    def append(self, node: Node) -> Node:
        return self._link(node, self._tail, None)

    def prepend(self, node: Node) -> Node:
        return self._link(node, None, self._head)

    def insert_before(self, anchor: Node, node: Node) -> Node:
        self._check_in_graph(anchor)
        return self._link(node, anchor._prev, anchor)

    def insert_after(self, anchor: Node, node: Node) -> Node:
        self._check_in_graph(anchor)
        return self._link(node, anchor, anchor._next)

    def erase(self, node: Node) -> None:
        """Remove a node whose results are unused."""
        self._check_in_graph(node)
        for r in node.results:
            if r.has_uses:
                users = ", ".join(u.op for u in r.users) or "the graph outputs"
                raise GraphEditError(f"cannot erase {node.op}: its result {r!r} is still used by {users}")
        self._unlink(node)
        for v in node.operands:
            _drop_use(v, node)
        node.graph = None
        for r in node.results:
            r.graph = None

    def replace_all_uses(self, old: Value, new: Value, check_order: bool = True) -> None:
        """Make every user of ``old`` (nodes and graph outputs) use ``new`` instead.

        ``check_order=False`` lets a user come before ``new``'s producer; the caller then
        restores a topological order with ``topo_sort`` (the kernel fusion pass does, after
        replacing a group by one node)."""
        if old is new:
            return
        self._check_owned(old, "the replaced value")
        self._check_owned(new, "the replacement")
        if old.type != new.type:
            raise GraphEditError(f"cannot replace {old!r} with {new!r}: types differ ({old.type} vs {new.type})")
        p = new.producer
        if p is not None and check_order:
            # Checked for every user first, so a refused edit leaves the graph untouched.
            for user in old.users:
                if not p.is_before(user):
                    raise GraphEditError(
                        f"cannot replace {old!r} with {new!r}: {new!r} is defined by {p.op}, "
                        f"which is not before its new user {user.op}"
                    )
        for user, count in list(old.users.items()):
            ops = user.operands
            for i, v in enumerate(ops):
                if v is old:
                    ops[i] = new
            new.users[user] = new.users.get(user, 0) + count
        old.users.clear()
        if old._out_uses:
            self.outputs = [new if v is old else v for v in self.outputs]
            new._out_uses += old._out_uses
            old._out_uses = 0

    def set_operand(self, node: Node, index: int, value: Value) -> None:
        """Make operand ``index`` of ``node`` be ``value`` (defined before ``node``)."""
        self._check_in_graph(node)
        self._check_owned(value, "an operand")
        if not -len(node.operands) <= index < len(node.operands):
            raise GraphEditError(f"{node.op} has {len(node.operands)} operand(s); operand index {index} is out of range")
        if value.producer is not None and not value.producer.is_before(node):
            raise GraphEditError(f"{node.op}: operand {value!r} would be used before its definition")
        old = node.operands[index]
        _drop_use(old, node)
        node.operands[index] = value
        value.users[node] = value.users.get(node, 0) + 1

    def move_before(self, anchor: Node, node: Node) -> None:
        """Move an existing node; the caller keeps the order valid (checked by ``verify``)."""
        self._check_in_graph(node)
        self._check_in_graph(anchor)
        if anchor is node:
            return
        self._unlink(node)
        self._link_raw(node, anchor._prev, anchor)

    # --- ordering -----------------------------------------------------------------------
    def topo_sort(self) -> None:
        """Re-sort nodes into a topological order, stable with respect to the current one.

        Raises GraphEditError naming the nodes on a cycle if there is one.
        """
        nodes = list(self.nodes)
        pos = {n: i for i, n in enumerate(nodes)}
        indeg = {}
        for n in nodes:
            indeg[n] = sum(1 for v in set(n.operands) if v.producer is not None and v.producer in pos)
        import heapq

        ready = [pos[n] for n in nodes if indeg[n] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            n = nodes[heapq.heappop(ready)]
            order.append(n)
            for r in n.results:
                for u in r.users:
                    indeg[u] -= 1
                    if indeg[u] == 0:
                        heapq.heappush(ready, pos[u])
        if len(order) != len(nodes):
            stuck = {n for n in nodes if indeg[n] > 0}
            cycle = _find_node_cycle(stuck)
            shown = " -> ".join(node_summary(n) for n in cycle + cycle[:1])
            raise GraphEditError(f"the graph has a cycle ({len(stuck)} node(s) cannot be ordered): {shown}")
        prev = None
        for n in order:
            n._prev = prev
            if prev is not None:
                prev._next = n
            prev = n
        self._head = order[0] if order else None
        self._tail = prev
        if prev is not None:
            prev._next = None
        self.renumber()

    def renumber(self) -> None:
        o = 0
        for n in self.nodes:
            o += _GAP
            n._order = o

    # --- whole-graph helpers ---------------------------------------------------------------
    def clone(self) -> "Graph":
        """A structural copy sharing nothing mutable (attribute values are immutable)."""
        g = Graph(self.name)
        g.loc = self.loc
        g.mesh = self.mesh
        g.weights = type(self.weights)(dict(self.weights))
        vmap: dict[Value, Value] = {}
        with bulk_build():
            for v in self.inputs:
                role = v.role
                assert role is not None, "add_input gives every input a role"
                w = vmap[v] = g.add_input(input_name(v), v.type, role)
                w.placement = v.placement
            append = g._append_unchecked
            for n in self.nodes:
                m = Node(n.op, [vmap[v] for v in n.operands], dict(n.attrs),
                         [r.type for r in n.results], n.loc, [r.name for r in n.results])
                m._text_loc = n._text_loc
                append(m)
                for a, b in zip(n.results, m.results):
                    vmap[a] = b
                    b.placement = a.placement
            g.set_outputs([vmap[v] for v in self.outputs],
                          [None if a is None else vmap[a] for a in self.output_aliases] or None)
        return g

    def structurally_equal(self, other: "Graph") -> bool:
        return self.diff(other) is None

    def diff(self, other: "Graph") -> str | None:
        """None if the graphs are structurally equal, else a description of the first difference."""
        if self.name != other.name:
            return f"names differ: {self.name} vs {other.name}"
        if self.mesh != other.mesh:
            return f"meshes differ: {self.mesh} vs {other.mesh}"
        if len(self.inputs) != len(other.inputs):
            return f"input counts differ: {len(self.inputs)} vs {len(other.inputs)}"
        vmap: dict[Value, Value] = {}
        for a, b in zip(self.inputs, other.inputs):
            if (a.name, a.type, a.role) != (b.name, b.type, b.role):
                return f"input differs: {a!r} {a.role} vs {b!r} {b.role}"
            if a.placement != b.placement:
                return f"input {a!r} placements differ: {a.placement} vs {b.placement}"
            vmap[a] = b
        if len(self) != len(other):
            return f"node counts differ: {len(self)} vs {len(other)}"
        for i, (n, m) in enumerate(zip(self.nodes, other.nodes)):
            if n.op != m.op or n.loc != m.loc or not _same_attrs(n.attrs, m.attrs):
                return f"node {i} differs: {n.op}{n.attrs} {n.loc} vs {m.op}{m.attrs} {m.loc}"
            if len(n.operands) != len(m.operands) or any(vmap.get(a) is not b for a, b in zip(n.operands, m.operands)):
                return f"node {i} ({n.op}) operands differ"
            if [r.type for r in n.results] != [r.type for r in m.results]:
                return f"node {i} ({n.op}) result types differ"
            for a, b in zip(n.results, m.results):
                if a.name != b.name and not (_anonymous(a.name) and _anonymous(b.name)):
                    return f"node {i} ({n.op}) result names differ: {a.name} vs {b.name}"
                if a.placement != b.placement:
                    return f"node {i} ({n.op}) result {a.index} placements differ: {a.placement} vs {b.placement}"
                vmap[a] = b
        if len(self.outputs) != len(other.outputs) or any(vmap.get(a) is not b for a, b in zip(self.outputs, other.outputs)):
            return "outputs differ"
        for i in range(len(self.outputs)):
            x, y = self.output_alias(i), other.output_alias(i)
            if (x is None) != (y is None) or (x is not None and vmap.get(x) is not y):
                return f"output {i} aliases differ: {x!r} vs {y!r}"
        return None

    # --- internals ----------------------------------------------------------------------
    def _check_in_graph(self, node: Node) -> None:
        if node.graph is not self:
            raise GraphEditError(f"{node.op} is not a node of graph @{self.name}")

    def _check_owned(self, v: Value, what: str) -> None:
        if v.graph is not self:
            raise GraphEditError(f"{what} {v!r} does not belong to graph @{self.name}")

    def _link(self, node: Node, prev: Node | None, nxt: Node | None) -> Node:
        if node.graph is not None:
            raise GraphEditError(f"{node.op} is already in graph @{node.graph.name}")
        for v in node.operands:
            self._check_owned(v, f"{node.op}: operand")
        self._link_raw(node, prev, nxt)
        for i, v in enumerate(node.operands):
            p = v.producer
            if p is not None and not p._order < node._order:
                self._unlink(node)
                node.graph = None
                raise GraphEditError(f"{node.op}: operand {i} ({v!r}, a result of {p.op}) is used before its "
                                     f"definition; insert {node.op} after that {p.op}")
        for v in node.operands:
            v.users[node] = v.users.get(node, 0) + 1
        for r in node.results:
            r.graph = self
        return node

    def _link_raw(self, node: Node, prev: Node | None, nxt: Node | None) -> None:
        if nxt is None:
            node._order = prev._order + _GAP if prev is not None else _GAP
        else:
            lo = prev._order if prev is not None else -1
            hi = nxt._order
            if hi - lo >= 2:
                node._order = (lo + hi) // 2
            else:
                self._relabel_around(node, prev, nxt)
        node.graph = self
        node._prev, node._next = prev, nxt
        if prev is None:
            self._head = node
        else:
            prev._next = node
        if nxt is None:
            self._tail = node
        else:
            nxt._prev = node
        self._count += 1

    def _relabel_around(self, node: Node, prev: Node | None, nxt: Node) -> None:
        """Make room for ``node`` between ``prev`` and ``nxt`` by spreading out a few neighbours.

        The classic order-maintenance scheme: find the smallest aligned label range
        [base, base + 2**i) around the insertion point holding few enough nodes (at most
        (2/T)**i with T = 1.5), then spread those nodes evenly over it. Repeated insertions
        at one spot cost O(log n) relabels each (amortized), instead of renumbering the graph.
        """
        anchor = prev if prev is not None else nxt
        label = anchor._order
        left = right = anchor
        count = 2  # the anchor and the new node
        i = 0
        while True:
            i += 1
            base = (label >> i) << i
            end = base + (1 << i)
            while left._prev is not None and left._prev._order >= base:
                left = left._prev
                count += 1
            while right._next is not None and right._next._order < end:
                right = right._next
                count += 1
            if count <= (1 << i) / 1.5 ** i:
                break
        step = (1 << i) // count
        o = base
        n = left
        if prev is None:
            node._order = o
            o += step
        while True:
            n._order = o
            o += step
            if n is prev:
                node._order = o
                o += step
            if n is right:
                break
            following = n._next
            assert following is not None, "right was reached from left by following _next"
            n = following

    def _append_unchecked(self, node: Node) -> Node:
        """Append a node known to be well formed (operands owned and defined earlier).

        For the parser and ``clone``, which create every value they use in order; it skips
        the checks of ``append`` but keeps use lists and the order numbering exact.
        """
        tail = self._tail
        node.graph = self
        node._prev = tail
        node._next = None
        if tail is None:
            self._head = node
            node._order = _GAP
        else:
            tail._next = node
            node._order = tail._order + _GAP
        self._tail = node
        self._count += 1
        for v in node.operands:
            u = v.users
            u[node] = u.get(node, 0) + 1
        for r in node.results:
            r.graph = self
        return node

    def _unlink(self, node: Node) -> None:
        # The node keeps its old links: a walk over ``nodes`` that was visiting a neighbour
        # follows them to skip past nodes erased during the visit.
        p, n = node._prev, node._next
        if p is None:
            self._head = n
        else:
            p._next = n
        if n is None:
            self._tail = p
        else:
            n._prev = p
        self._count -= 1


def _drop_use(v: Value, node: Node) -> None:
    c = v.users.get(node, 0)
    if c <= 1:
        v.users.pop(node, None)
    else:
        v.users[node] = c - 1


def _anonymous(name: str | None) -> bool:
    return name is None or name.isdigit()


def _same_value(a: Any, b: Any) -> bool:
    """Attribute equality that tells 1, 1.0 and true (and 0.0 and -0.0) apart, with NaN
    equal to NaN: the text form keeps all of these distinctions."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return (a == b and math.copysign(1.0, a) == math.copysign(1.0, b)) or (a != a and b != b)
    if type(a) is tuple:
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def _same_attrs(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)


def node_summary(node: Node) -> str:
    """A node in one short line for messages: its named results, op and source location."""
    res = ", ".join(f"%{r.name}" for r in node.results if r.name is not None)
    where = f" at {node.text_loc or node.loc}" if (node.text_loc or node.loc) else ""
    return f"{res + ' = ' if res else ''}{node.op}{where}"


def _find_node_cycle(stuck: set[Node]) -> list[Node]:
    """One cycle among ``stuck`` (nodes left over by a topological sort), in use order."""
    # Every stuck node has an operand produced by a stuck node, so walking from any of them
    # along such operands must revisit a node: the part of the walk after it is a cycle.
    n = next(iter(sorted(stuck, key=lambda x: x._order)))
    seen: dict[Node, int] = {}
    path: list[Node] = []
    while n not in seen:
        seen[n] = len(path)
        path.append(n)
        n = next(v.producer for v in n.operands if v.producer in stuck)
    cycle = path[seen[n]:]
    cycle.reverse()  # producers first: a -> b reads "a is used by b"
    k = min(range(len(cycle)), key=lambda i: cycle[i]._order)
    return cycle[k:] + cycle[:k]  # from the node listed first
