"""Print a Graph in the ``.pir`` text form (grammar: docs/ir.md).

Result values whose name is unset or purely numeric are numbered ``%0, %1, ...`` in order;
named values keep their names. So print -> parse -> print is the identity.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from .attrs import DenseAttr
from .dtypes import DType
from .graph import Graph, Node, Value
from .types import Location, TensorType

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
# Inputs are bound by name (weights, feeds), so any name the lexer reads back is kept as is,
# e.g. "0.weight" of a torch Sequential; node results need a leading letter to stay apart
# from the anonymous %0, %1, ...
_INPUT_NAME_RE = re.compile(r"[A-Za-z0-9_.]+\Z")
WRAP = 100


def value_names(graph: Graph) -> dict[Value, str]:
    """The name (without ``%``) each value of ``graph`` has in its printed text, for messages
    and reports that must match the IR a user reads."""
    p = GraphPrinter(graph)
    p.assign_names()
    return p.names


def print_graph(graph: Graph) -> str:
    return GraphPrinter(graph).run()


def print_graph_lines(graph: Graph) -> tuple[list[str], dict[Node, int]]:
    """The printed lines and, for each node, the index of its line (for diagnostics)."""
    p = GraphPrinter(graph)
    text = p.run()
    return text.splitlines(), p.node_lines


def format_type(t: TensorType) -> str:
    return f"{t.dtype.name}[{','.join(map(str, t.shape))}]"


def format_placed_type(t: TensorType, placement) -> str:
    """A type with its placement, ``f32[32@dp,256@tp] partial(tp)``; plain if ``placement`` is None."""
    if placement is None:
        return format_type(t)
    return t.dtype.name + placement.format_shape(t.shape) + placement.format_partial()


def format_attr(v: Any) -> str:
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "none"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _format_float(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, DType):
        return v.name
    if isinstance(v, tuple):
        return _format_list(v)
    if isinstance(v, DenseAttr):
        return format_dense(v)
    raise TypeError(f"cannot print attribute value of type {type(v).__name__}")


def _format_list(v: tuple) -> str:
    """A (nested) list, without recursion: a value built in code may nest deeper than the
    parser's limit, and an error message that shows it must not fail."""
    out: list[str] = ["["]
    stack = [iter(v)]
    first = True
    while stack:
        x = next(stack[-1], _END)
        if x is _END:
            stack.pop()
            out.append("]")
            first = False
            continue
        if not first:
            out.append(", ")
        if isinstance(x, tuple):
            out.append("[")
            stack.append(iter(x))
            first = True
        else:
            out.append(format_attr(x))
            first = False
    return "".join(out)


_END = object()


def _format_float(x: float) -> str:
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    s = repr(x)
    return s if any(c in s for c in ".en") else s + ".0"


def format_dense(d: DenseAttr) -> str:
    t = d.type
    size = d.size
    splat = d.splat_array() if size > 1 else None  # None: not a splat
    if splat is not None:  # a splat prints as its value, and is never built as an array
        body = _scalar_text(splat.reshape(1), t.dtype)[0]
    elif size == 0:
        # Empty: nested down to the first 0 ([[], []] for f32[2,0]) when that is short;
        # `[]` reads back as any empty tensor.
        lists = 1
        for n in t.shape:
            if n == 0:
                break
            lists *= n
        body = _nest([], t.shape) if lists <= EMPTY_LISTS else "[]"
    elif t.rank == 0:
        body = _scalar_text(d.array.reshape(1), t.dtype)[0]
    else:
        a = d.array
        flat = _scalar_text(a.reshape(-1), t.dtype)
        body = _nest(flat, a.shape)
    return f"dense<{format_type(t)}, {body}>"


# The most innermost lists an empty tensor prints (see format_dense).
EMPTY_LISTS = 1024


def _scalar_text(flat: np.ndarray, dt: DType) -> list[str]:
    if dt.is_bool:
        return ["true" if x else "false" for x in flat.tolist()]
    if dt.is_int:
        return [str(x) for x in flat.tolist()]
    if dt.bits == 64:
        return [_format_float(x) for x in flat.tolist()]
    # f16, bf16 and f32 all embed exactly in f32: print the shortest f32 repr.
    out = []
    for x in flat.astype(np.float32):
        s = str(x)
        out.append(s if any(c in s for c in ".en") else s + ".0")
    return out


def _nest(flat: list[str], shape: tuple[int, ...]) -> str:
    if len(shape) == 1:
        return "[" + ", ".join(flat) + "]"
    if shape[0] == 0:
        return "[]"
    step = len(flat) // shape[0] if shape[0] else 0
    return "[" + ", ".join(_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])) + "]"


def format_loc(loc: Location) -> str:
    s = f"loc({json.dumps(loc.file)}:{loc.line}" + (f":{loc.col}" if loc.col else "")
    s += f" in {json.dumps(loc.scope)}" if loc.scope else ""
    return s + (f" recompute {json.dumps(loc.recompute)})" if loc.recompute else ")")


class GraphPrinter:
    """Prints one graph; ``assign_names`` alone gives each value its printed name."""
    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.names: dict[Value, str] = {}
        self.type_cache: dict[TensorType, str] = {}
        self.placed_cache: dict[tuple, str] = {}
        self.node_lines: dict[Node, int] = {}

    def type_str(self, t: TensorType) -> str:
        s = self.type_cache.get(t)
        if s is None:
            s = self.type_cache[t] = format_type(t)
        return s

    def value_type(self, v: Value) -> str:
        """The type of ``v`` as printed: with its placement when it has one."""
        p = v.placement
        if p is None:
            return self.type_str(v.type)
        key = (v.type, p)
        s = self.placed_cache.get(key)
        if s is None:
            s = self.placed_cache[key] = format_placed_type(v.type, p)
        return s

    def assign_names(self) -> None:
        taken: set[str] = set()
        names = self.names
        for v in self.g.inputs:
            n = v.name if v.name is not None and _INPUT_NAME_RE.match(v.name) else None
            if n is None or n in taken:
                n = _fresh(v.name or "arg", taken)
            names[v] = n
            taken.add(n)
        pending = []
        for node in self.g.nodes:
            for r in node.results:
                nm = r.name
                if nm is not None and not nm.isdigit() and _NAME_RE.match(nm) and nm not in taken:
                    names[r] = nm
                    taken.add(nm)
                else:
                    pending.append(r)
        i = 0
        for r in pending:
            while str(i) in taken:
                i += 1
            names[r] = str(i)
            i += 1

    def run(self) -> str:
        from ..ops.registry import OPS

        self.assign_names()
        g, names, vt = self.g, self.names, self.value_type
        args = [f"%{names[v]}: {vt(v)}" + ("" if v.role == "input" else f" {v.role}") for v in g.inputs]
        rets = ", ".join(vt(v) + ("" if (al := g.output_alias(i)) is None else f" aliases(%{names[al]})")
                         for i, v in enumerate(g.outputs))
        head = f"graph @{g.name}("
        mesh = "" if g.mesh is None else f" {g.mesh}"
        tail = f") -> ({rets}){mesh} {{"
        one_line = head + ", ".join(args) + tail
        if len(one_line) <= WRAP or not args:
            lines = [one_line]
        else:
            lines = [head]
            for i, a in enumerate(args):
                lines.append("    " + a + ("," if i < len(args) - 1 else ""))
            lines.append(tail)
        node_lines = self.node_lines
        for node in g.nodes:
            node_lines[node] = len(lines)
            lines.append(self.node_line(node, OPS.get(node.op)))
        lines.append("  return " + ", ".join("%" + names[v] for v in g.outputs) if g.outputs else "  return")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def node_line(self, node: Node, opdef) -> str:
        names, ts = self.names, self.type_str
        ops = node.operands
        if len(ops) == 1:
            args = "%" + names[ops[0]]
        else:
            args = ", ".join(["%" + names[v] for v in ops])
        attrs = node.attrs
        attr_s = ""
        if attrs:
            shown = opdef.non_default_attrs(attrs) if opdef is not None else attrs
            if shown:
                attr_s = " {" + ", ".join([f"{k}={format_attr(v)}" for k, v in shown.items()]) + "}"
        res = node.results
        if len(res) == 1:
            r = res[0]
            rt = ts(r.type) if r.placement is None else self.value_type(r)
            line = f"  %{names[r]} = {node.op}({args}){attr_s} : {rt}"
        elif res:
            vt = self.value_type
            line = (f"  {', '.join(['%' + names[r] for r in res])} = {node.op}({args}){attr_s} : "
                    f"{', '.join([vt(r) for r in res])}")
        else:
            line = f"  {node.op}({args}){attr_s}"
        if node.loc is not None:
            line += " " + format_loc(node.loc)
        return line


def _fresh(base: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.]", "_", base) or "v"
    if not _NAME_RE.match(base):
        base = "v" + base
    n, i = base, 0
    while n in taken:
        i += 1
        n = f"{base}_{i}"
    return n
