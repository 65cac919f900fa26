"""The verifier: SSA, use lists, attributes, type rules and outputs.

Errors name the node, show the IR around it and say what was expected. Type-rule results
are cached per (op, operand types, attributes): real graphs repeat the same signatures.
"""

from __future__ import annotations

from .diagnostics import PartitaError, VerifyError
from .graph import ROLES, Graph, Node, Value


def verify(graph: Graph) -> Graph:
    """Check every IR invariant of ``graph``; return it unchanged or raise VerifyError."""
    from ..ops.registry import OPS

    defined: set[Value] = set()
    names: dict[str, Value] = {}
    for v in graph.inputs:
        if v.role not in ROLES:
            raise VerifyError(f"@{graph.name}: input %{v.name} has role '{v.role}'; expected one of {', '.join(ROLES)}")
        if v.producer is not None or v.graph is not graph:
            raise VerifyError(f"@{graph.name}: input %{v.name} is not owned by the graph")
        if v.name in names:
            raise VerifyError(f"@{graph.name}: two inputs are named %{v.name}; input names must be unique")
        names[v.name] = v
        defined.add(v)

    infer_cache: dict = {}
    use_counts: dict[Value, dict[Node, int]] = {}
    last_order = None
    count = 0
    for node in graph.nodes:
        count += 1
        if node.graph is not graph:
            raise _node_error(graph, node, "is linked into the graph but does not belong to it")
        if last_order is not None and node._order <= last_order:
            graph.renumber()
        last_order = node._order
        opdef = OPS.get(node.op)
        if opdef is None:
            from .diagnostics import suggest

            raise _node_error(graph, node, f"uses unknown op '{node.op}'{suggest(node.op, OPS)}")
        for i, v in enumerate(node.operands):
            if v not in defined:
                if v.graph is not graph:
                    what = "a value from another graph (or an erased node)"
                else:
                    what = "a value defined later (use before definition)"
                raise _node_error(graph, node, f"operand {i} (%{v.name}) is {what}; "
                                               "every operand must be defined before its use")
            uc = use_counts.get(v)
            if uc is None:
                use_counts[v] = {node: 1}
            else:
                uc[node] = uc.get(node, 0) + 1
        try:
            key = (node.op, tuple(v.type for v in node.operands), tuple(node.attrs.items()))
            hash(key)
        except TypeError:
            raise _node_error(graph, node, "has an attribute value that is not immutable "
                                           "(use tuples, not lists; DenseAttr, not arrays)") from None
        want = infer_cache.get(key)
        if want is None:
            try:
                norm = opdef.normalize_attrs(node.attrs)
                if norm != node.attrs or any(type(norm[k]) is not type(node.attrs[k]) for k in norm):
                    raise VerifyError(f"attributes {node.attrs} are not in normal form (expected {norm})")
                want = opdef.infer_types([v.type for v in node.operands], node.attrs)
            except PartitaError as e:
                raise _node_error(graph, node, f"is invalid: {e}") from None
            infer_cache[key] = want
        got = tuple(r.type for r in node.results)
        if got != want:
            if len(got) != len(want):
                msg = f"has {len(got)} result(s) but {node.op} produces {len(want)}"
            else:
                msg = ("has result type(s) " + ", ".join(map(str, got)) +
                       f" but the type rule of {node.op} gives " + ", ".join(map(str, want)))
            raise _node_error(graph, node, msg)
        for r in node.results:
            if r.producer is not node or r.graph is not graph:
                raise _node_error(graph, node, f"result %{r.name} is not linked to its node")
            defined.add(r)
    if count != len(graph):
        raise VerifyError(f"@{graph.name}: node count {len(graph)} disagrees with the node list ({count})")

    for v in defined:
        if v.users != use_counts.get(v, {}):
            raise VerifyError(f"@{graph.name}: the use list of %{v.name} is stale "
                              f"(records {sum(v.users.values())} use(s), the graph has "
                              f"{sum(use_counts.get(v, {}).values())})")
    out_counts: dict[Value, int] = {}
    for i, v in enumerate(graph.outputs):
        if v not in defined:
            raise VerifyError(f"@{graph.name}: output {i} (%{v.name}) is not defined in the graph")
        out_counts[v] = out_counts.get(v, 0) + 1
    for v in defined:
        if v._out_uses != out_counts.get(v, 0):
            raise VerifyError(f"@{graph.name}: the output count of %{v.name} is stale")
    return graph


def _node_error(graph: Graph, node: Node, msg: str) -> VerifyError:
    where = node.text_loc or node.loc
    head = f"{where}: " if where else ""
    res = ", ".join(f"%{r.name}" for r in node.results if r.name is not None)
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
