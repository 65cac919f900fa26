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
        norm = opdef.normalize_attrs(attrs)
        types = opdef.infer_types([v.type for v in operands], norm)
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
