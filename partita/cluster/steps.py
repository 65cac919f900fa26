"""The programs the simulator plays: a per-rank program cut into compute runs and
communications (``Program``, ``Comm``), and the facts its builders share, the flat one
(``simulator.prepare``) and the pipeline sections' (``pipeline_sim``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ..backend.torch_exec import async_ops
from ..ir.graph import Graph, Node, Value
from ..ops.registry import OPS

# Ops the runtime (TorchProgram(overlap=True)) starts and waits for where their result is first
# read: all_reduce, all_gather, reduce_scatter, ring_shift, send, recv.
ASYNC_OPS = async_ops()


@dataclass
class Comm:
    """One communication of a program: the node, its mesh axis and its number there."""

    node: Node
    axis: str
    ordinal: int           # k-th collective on this axis (or k-th transfer to/from this peer)
    is_async: bool
    peer: int | None       # send/recv: the peer's coordinate along axis
    sending: bool = False


@dataclass(frozen=True, slots=True)
class Run:
    """A run of compute ops: ``seconds`` on the compute stream, the program's nodes ``first``
    to ``last`` (exclusive; the trace names each)."""

    seconds: float
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class SectionRun:
    """A run of compute ops of a section-level program (pipeline_sim.py): ``seconds`` on the
    compute stream, one span named ``label`` in the trace."""

    seconds: float
    label: str


@dataclass(frozen=True, slots=True)
class Issue:
    """Communication ``comm`` (an index into ``Program.comms``) is issued here."""

    comm: int


@dataclass(frozen=True, slots=True)
class Wait:
    """The compute stream waits here for communication ``comm`` to complete."""

    comm: int


@dataclass(frozen=True, slots=True)
class Piece:
    """A precomputed stretch of a section-level program (pipeline_sim.py): ``duration`` on the
    compute stream, of which ``busy`` computing and ``waiting`` waiting for its own
    communication; ``comm_busy`` and ``comm_bytes``: (axis, seconds or bytes) of that
    communication's streams; ``label`` names its span in the trace; ``waits``: (axis,
    seconds) of ``waiting``."""

    duration: float
    busy: float
    waiting: float
    comm_busy: tuple[tuple[str, float], ...]
    comm_bytes: tuple[tuple[str, float], ...]
    label: str
    waits: tuple[tuple[str, float], ...] = ()


# One step of a program.
Step: TypeAlias = Run | SectionRun | Issue | Wait | Piece


@dataclass(frozen=True, slots=True)
class Hoisted:
    """Communication ``comm`` issued ``offset`` seconds after the start clock of the step it
    is listed under (``Program.hoist``)."""

    offset: float
    comm: int


@dataclass
class Program:
    """A per-rank program cut into ``steps`` (``Step``: compute runs, issues of and waits for
    its ``comms``, precomputed pieces)."""

    graph: Graph
    steps: list[Step]
    comms: list[Comm]
    nodes: list[Node]
    durations: list[float]       # per node (0 for communication and hoisted nodes)
    flops: float                  # compute FLOPs of one run of the program
    kinds: dict[str, float]       # seconds of compute by kind (gemm, attention, memory, ...)
    # Section-level programs (pipeline_sim.py): step index -> the communications issued at an
    # offset from that step's start clock (a collective hoisted into an earlier step).
    hoist: dict[int, list[Hoisted]] = field(default_factory=dict)


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
