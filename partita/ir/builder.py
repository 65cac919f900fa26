"""Build graphs from Python with types inferred by the op records.

    g = Graph("mlp")
    b = Builder(g)
    x = b.input("x", TensorType((32, 784), f32))
    w = b.param("w", TensorType((784, 256), f32))
    y = b.relu(b.matmul(x, w))
    b.ret(y)
"""

from __future__ import annotations

from typing import Any

from .diagnostics import PartitaError
from .dtypes import DType
from .graph import Graph, Node, Value
from .types import Location, TensorType


class Builder:
    """Emits nodes at an insertion point (the end of the graph, or before/after a node)."""

    def __init__(self, graph: Graph | None = None, *, loc: Location | None = None) -> None:
        self.graph = graph if graph is not None else Graph()
        self.loc = loc
        self._before: Node | None = None
        self._after: Node | None = None

    # --- insertion point --------------------------------------------------------------
    def set_insertion_before(self, node: Node) -> "Builder":
        self._before, self._after = node, None
        return self

    def set_insertion_after(self, node: Node) -> "Builder":
        self._before, self._after = None, node
        return self

    def set_insertion_end(self) -> "Builder":
        self._before = self._after = None
        return self

    # --- inputs and outputs -------------------------------------------------------------
    def input(self, name: str, type: TensorType, role: str = "input") -> Value:
        return self.graph.add_input(name, type, role)

    def param(self, name: str, type: TensorType) -> Value:
        return self.graph.add_input(name, type, "param")

    def state(self, name: str, type: TensorType) -> Value:
        return self.graph.add_input(name, type, "state")

    def ret(self, *values: Value) -> Graph:
        self.graph.set_outputs(values)
        return self.graph

    # --- emitting ---------------------------------------------------------------------
    def emit_node(self, op: str, operands, attrs: dict[str, Any] | None = None, *,
                  loc: Location | None = None, name: str | None = None) -> Node:
        """Create, type and insert one node; returns the node."""
        from ..ops.registry import get_op

        if not isinstance(op, str):
            raise PartitaError(f"emit: an op is named by a string (like 'add'), got {type(op).__name__} {op!r:.40}")
        opdef = get_op(op)
        operands = list(operands)
        for i, v in enumerate(operands):
            if not isinstance(v, Value):
                raise PartitaError(f"{op}: operand {i} is a {type(v).__name__}, not a Value")
        norm, types = _typed(opdef, attrs, [v.type for v in operands])
        names = [name] * len(types) if name is not None and len(types) == 1 else None
        node = Node(op, operands, norm, types, loc or self.loc, names)
        g = self.graph
        if self._before is not None:
            g.insert_before(self._before, node)
        elif self._after is not None:
            g.insert_after(self._after, node)
            self._after = node
        else:
            g.append(node)
        return node

    def emit(self, op: str, /, *operands: Value, loc: Location | None = None, name: str | None = None,
             **attrs: Any) -> Any:
        """Emit ``op``; returns its Value, or a tuple of Values for a multi-result op."""
        node = self.emit_node(op, operands, attrs, loc=loc, name=name)
        return node.results[0] if len(node.results) == 1 else tuple(node.results)

    def __getattr__(self, op: str):
        if op.startswith("_"):
            raise AttributeError(op)
        from ..ops.registry import OPS

        if op not in OPS:
            raise AttributeError(f"Builder has no method or op named '{op}'")

        def emit_op(*operands: Value, loc: Location | None = None, name: str | None = None, **attrs: Any):
            return self.emit(op, *operands, loc=loc, name=name, **attrs)

        return emit_op


# The normalized attributes and result types by (op record, attributes, operand types): the
# passes emit the same few nodes by the thousand (every layer alike). Only attributes of plain
# values are keyed (never a tensor constant's data; a float by its repr, so -0.0 is not 0.0).
_TYPED: "dict[tuple, tuple[dict[str, Any], tuple]]" = {}
_EXACT = (int, str, bool, type(None), DType)


def _attr_key(attrs: "dict[str, Any] | None") -> "tuple | None":
    """A key that tells apart every two attribute dicts a rule could tell apart, or None."""
    out: list[tuple] = []
    for k, v in (attrs or {}).items():
        t = type(v)
        if t is float:
            out.append((k, t, repr(v)))
        elif t in _EXACT:
            out.append((k, t, v))
        elif t is tuple and all(type(x) in _EXACT for x in v):
            out.append((k, t, tuple([type(x) for x in v]), v))
        else:
            return None
    return tuple(out)


def _typed(opdef: Any, attrs: "dict[str, Any] | None", types: list) -> "tuple[dict[str, Any], tuple]":
    """``opdef``'s normalized ``attrs`` (a fresh dict) and its result types on ``types``."""
    items = _attr_key(attrs)
    if items is None:
        norm = opdef.normalize_attrs(attrs)
        return norm, opdef.infer_types(types, norm)
    key = (opdef, items, tuple(types))
    got = _TYPED.get(key)
    if got is None:
        norm = opdef.normalize_attrs(attrs)
        got = (norm, opdef.infer_types(types, norm))
        if len(_TYPED) >= 1 << 14:
            _TYPED.clear()
        _TYPED[key] = got
    return dict(got[0]), got[1]
