"""The programs the simulator plays: a per-rank program cut into compute runs and
communications (``Program``, ``Comm``), and the facts its builders share, the flat one
(``simulator.prepare``) and the pipeline sections' (``pipeline_sim``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir.graph import Graph, Node, Value
from ..ops.registry import OPS

# Ops the runtime starts and waits for later (their records have a torch_async form).
ASYNC_OPS = frozenset(n for n, d in OPS.items() if d.torch_async is not None)


@dataclass
class Comm:
    """One communication of a program: the node, its mesh axis and its number there."""

    node: Node
    axis: str
    ordinal: int           # k-th collective on this axis (or k-th transfer to/from this peer)
    is_async: bool
    peer: int | None       # send/recv: the peer's coordinate along axis
    sending: bool = False


@dataclass
class Program:
    """A per-rank program cut into steps: ("run", seconds, first node index, last) for a run of
    compute ops, ("comm", Comm index) where a communication is issued, ("wait", Comm index)
    where the compute stream waits for one."""

    graph: Graph
    steps: list[tuple]
    comms: list[Comm]
    nodes: list[Node]
    durations: list[float]       # per node (0 for communication and hoisted nodes)
    flops: float                  # compute FLOPs of one run of the program
    kinds: dict[str, float]       # seconds of compute by kind (gemm, attention, memory, ...)
    # Section-level programs (pipeline_sim.py): step index -> (offset, comm index) issued at
    # that step's start clock plus offset (a collective hoisted into an earlier step).
    hoist: dict[int, list[tuple[float, int]]] = field(default_factory=dict)


def is_hoisted(node: Node, outputs: set[Value]) -> bool:
    """Whether the runtime computes ``node`` once, outside the step: no operands, no effects, one
    result that is not a program output (a constant)."""
    return not node.operands and len(node.results) == 1 and not OPS[node.op].effects_of(node.attrs) \
        and node.results[0] not in outputs


def attr_key(attrs: dict) -> tuple:
    """A hashable key of a node's attributes (arrays by shape and leading bytes), to price alike
    nodes once."""
    out = []
    for k, v in sorted(attrs.items()):
        if isinstance(v, list):
            v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        elif hasattr(v, "tobytes"):
            v = (getattr(v, "shape", None), v.tobytes()[:64])
        out.append((k, v if _hashable(v) else repr(v)))
    return tuple(out)


def _hashable(v: Any) -> bool:
    try:
        hash(v)
        return True
    except TypeError:
        return False
