"""The verifier: SSA, use lists, attributes, type rules, placements and outputs.

Placements are checked against the value's shape and the graph's mesh only; whether they
agree with the ops is for the sharding rules (propagation), not for the verifier.

Errors name the node, show the IR around it and say what was expected. Type-rule results
are cached per (op, operand types, attributes): real graphs repeat the same signatures.
"""

from __future__ import annotations

from .diagnostics import PartitaError, VerifyError
from .graph import ROLES, Graph, Node, Value, node_summary


def verify(graph: Graph) -> Graph:
    """Check every IR invariant of ``graph``; return it unchanged or raise VerifyError."""
    from ..ops.registry import OPS

    if not isinstance(graph, Graph):
        raise VerifyError(f"verify: the graph must be a partita.Graph (from partita.load, partita.parse or an "
                          f"import), got {type(graph).__name__}")
    nm = _ValueNames(graph)
    defined: set[Value] = set()
    names: dict[str, Value] = {}
    for v in graph.inputs:
        if v.role not in ROLES:
            raise VerifyError(f"@{graph.name}: input {nm(v)} has role '{v.role}'; expected one of {', '.join(ROLES)}")
        if v.producer is not None or v.graph is not graph:
            raise VerifyError(f"@{graph.name}: input {nm(v)} is not owned by the graph")
        name = v.name
        if name is None:
            raise VerifyError(f"@{graph.name}: input {v.index} has no name; inputs are bound by name, "
                              "so create them with Graph.add_input")
        if name in names:
            raise VerifyError(f"@{graph.name}: two inputs are named %{name}; input names must be unique")
        names[name] = v
        defined.add(v)
        if v.placement is not None:
            try:
                _check_placement(graph, v, nm)
            except VerifyError as e:
                raise VerifyError(f"@{graph.name}: input {nm(v)} has an invalid placement: {e}") from None

    infer_cache: dict = {}
    # For each value, the number of distinct nodes using it; each user's count is checked
    # against the node's operand list as the node is visited.
    user_nodes: dict[Value, int] = {}
    last_order = None
    count = 0
    for node in graph.nodes:
        count += 1
        if node.graph is not graph:
            raise _node_error(graph, node, nm, "is linked into the graph but does not belong to it")
        if last_order is not None and node._order <= last_order:
            graph.renumber()
        last_order = node._order
        op = node.op
        opdef = OPS.get(op)
        if opdef is None:
            from .diagnostics import suggest

            raise _node_error(graph, node, nm, f"uses unknown op '{op}'{suggest(op, OPS)}")
        operands = node.operands
        for i, v in enumerate(operands):
            if v not in defined:
                if v.graph is not graph:
                    what = "a value from another graph (or an erased node)"
                else:
                    what = "a value defined later (use before definition)"
                raise _node_error(graph, node, nm, f"operand {i} ({nm(v)}) is {what}; "
                                               "every operand must be defined before its use")
        if len(operands) == 1:
            counts = {operands[0]: 1}
        else:
            counts = {}
            for v in operands:
                counts[v] = counts.get(v, 0) + 1
        for v, c in counts.items():
            uses = v.users.get(node)
            if uses != c:
                raise _node_error(graph, node, nm, f"operand {nm(v)} has a stale use list (it records "
                                               f"{uses or 0} use(s) by this node, the node has {c})")
            user_nodes[v] = user_nodes.get(v, 0) + 1
        attrs = node.attrs
        try:
            key = (op, tuple([v.type for v in operands]), tuple(attrs.items()) if attrs else ())
            want = infer_cache.get(key)
        except TypeError:
            raise _node_error(graph, node, nm, "has an attribute value that is not immutable "
                                           "(use tuples, not lists; DenseAttr, not arrays)") from None
        if want is None:
            try:
                norm = opdef.normalize_attrs(attrs)
                if norm != attrs or any(type(norm[k]) is not type(attrs[k]) for k in norm):
                    raise VerifyError(f"attributes {attrs} are not in normal form (expected {norm})")
                want = opdef.infer_types([v.type for v in operands], attrs)
            except PartitaError as e:
                raise _node_error(graph, node, nm, f"is invalid: {e}") from None
            infer_cache[key] = want
        # "p2p" (send/recv, ops/collective.py) names an axis and group size as collectives do.
        if graph.mesh is not None and (opdef.collective is not None or "p2p" in opdef.effects_of(attrs)):
            _check_collective(graph, node, nm)
        results = node.results
        if len(results) == 1 and len(want) == 1:
            r = results[0]
            if r.type is not want[0] and r.type != want[0]:
                raise _node_error(graph, node, nm, f"has result type(s) {r.type} but the type rule of {op} gives {want[0]}")
        else:
            got = tuple(r.type for r in results)
            if got != want:
                if len(got) != len(want):
                    msg = f"has {len(got)} result(s) but {op} produces {len(want)}"
                else:
                    msg = ("has result type(s) " + ", ".join(map(str, got)) +
                           f" but the type rule of {op} gives " + ", ".join(map(str, want)))
                raise _node_error(graph, node, nm, msg)
        for r in results:
            if r.producer is not node or r.graph is not graph:
                raise _node_error(graph, node, nm, f"result {nm(r)} is not linked to its node")
            if r.placement is not None:
                try:
                    _check_placement(graph, r, nm)
                except VerifyError as e:
                    raise _node_error(graph, node, nm, f"has an invalid placement: {e}") from None
            defined.add(r)
    if count != len(graph):
        raise VerifyError(f"@{graph.name}: node count {len(graph)} disagrees with the node list ({count})")

    for v in defined:
        if len(v.users) != user_nodes.get(v, 0):
            stale = [u for u in v.users if u.graph is not graph or v not in u.operands]
            what = ", ".join(node_summary(u) for u in stale[:3]) or "?"
            raise VerifyError(f"@{graph.name}: the use list of {nm(v)} is stale: it records "
                              f"{len(v.users)} user node(s), the graph has {user_nodes.get(v, 0)} "
                              f"(users that are not in the graph or do not use it: {what})")
    out_counts: dict[Value, int] = {}
    for i, v in enumerate(graph.outputs):
        if v not in defined:
            raise VerifyError(f"@{graph.name}: output {i} ({nm(v)}) is not defined in the graph")
        out_counts[v] = out_counts.get(v, 0) + 1
    aliases = graph.output_aliases
    if aliases and len(aliases) != len(graph.outputs):
        raise VerifyError(f"@{graph.name}: {len(graph.outputs)} output(s) but {len(aliases)} alias entries")
    aliased: set[Value] = set()
    for i, a in enumerate(aliases):
        if a is None:
            continue
        o = graph.outputs[i]
        if a not in graph.inputs:
            raise VerifyError(f"@{graph.name}: output {i} ({nm(o)}) aliases {nm(a)}, which is not a graph input")
        if a.type != o.type:
            raise VerifyError(f"@{graph.name}: output {i} ({nm(o)}, {o.type}) aliases input {nm(a)} of "
                              f"another type ({a.type})")
        if a in aliased:
            raise VerifyError(f"@{graph.name}: two outputs alias input {nm(a)}; each input's buffer "
                              f"can be reused by one output only")
        aliased.add(a)
    for v in defined:
        if v._out_uses != out_counts.get(v, 0):
            raise VerifyError(f"@{graph.name}: the output count of {nm(v)} is stale "
                              f"(records {v._out_uses}, the graph outputs it {out_counts.get(v, 0)} time(s))")
    return graph


def _check_collective(graph: Graph, node: Node, nm: "_ValueNames") -> None:
    """A collective names an axis of the graph's mesh and the size of that axis."""
    mesh = graph.mesh
    assert mesh is not None
    axis, size = node.attrs.get("axis"), node.attrs.get("group_size")
    if axis not in mesh.names:
        raise _node_error(graph, node, nm, f"is a collective over axis '{axis}', which {mesh} does not have; "
                                       f"its axes are {', '.join(mesh.names)}")
    if size != mesh.axis_size(axis):
        raise _node_error(graph, node, nm, f"has group_size={size} but axis '{axis}' of {mesh} has "
                                       f"{mesh.axis_size(axis)} ranks; set group_size={mesh.axis_size(axis)}")


def _check_placement(graph: Graph, v: Value, nm: "_ValueNames") -> None:
    p = v.placement
    assert p is not None
    if graph.mesh is None:
        raise VerifyError(f"{nm(v)} is placed {p} but @{graph.name} has no mesh; "
                          f"set graph.mesh, or clear the placement")
    try:
        p.validate(v.type.shape, graph.mesh, nm(v))
    except PartitaError as e:
        raise VerifyError(str(e)) from None


class _ValueNames:
    """Names of values as the printer shows them (``%0`` for an unnamed value), computed
    only when an error needs them, so messages match the IR printed under them."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.names: dict[Value, str] | None = None

    def __call__(self, v: Value) -> str:
        if self.names is None:
            from .printer import GraphPrinter

            p = GraphPrinter(self.graph)
            try:
                p.assign_names()
            except Exception:  # a broken graph must still get its message
                pass
            self.names = p.names
        n = self.names.get(v)
        return "%" + (n if n is not None else v.name if v.name is not None else "?")


def _node_error(graph: Graph, node: Node, nm: _ValueNames, msg: str) -> VerifyError:
    where = node.text_loc or node.loc
    head = f"{where}: " if where else ""
    res = ", ".join(nm(r) for r in node.results)
    what = f"node {res + ' = ' if res else ''}{node.op}"
    src = f" (from {node.loc})" if node.loc and node.text_loc else ""
    return VerifyError(f"{head}error: {what}{src} {msg}\n{ir_context(graph, node)}")


def ir_context(graph: Graph, node: Node, radius: int = 2) -> str:
    """A few printed lines of IR around ``node``, the node's line marked with '>'."""
    from .printer import print_graph_lines

    try:
        lines, where = print_graph_lines(graph)
    except Exception as e:  # printing a broken graph may fail; the message must not
        return f"  (IR not printable: {e})"
    i = where.get(node)
    if i is None:
        return ""
    lo, hi = max(0, i - radius), min(len(lines), i + radius + 1)
    return "\n".join(f"{'>' if j == i else ' '} | {lines[j]}" for j in range(lo, hi))
