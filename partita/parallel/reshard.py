"""The reshard planner: the cheapest collectives that turn one placement into another.

A value placed one way (``have``) must often reach a consumer that needs it placed another
way (``want``). Every mesh axis is, for a placement, in one of three states: unused
(replicated along it), a pending sum (partial), or splitting one tensor dimension at some
position of that dimension's major-to-minor list. One collective over one axis changes that
axis's state:

=========================  ===================================  ==========================
from (on axis a)           to                                   op
=========================  ===================================  ==========================
partial                    replicated                           ``all_reduce``
partial                    split(d) (a becomes d's minor axis)  ``reduce_scatter``
split(d) (d's minor axis)  replicated                           ``all_gather``
split(i) (i's minor axis)  split(j) (j's minor axis)            ``all_to_all``
replicated                 split(d) (a becomes d's minor axis)  ``shard_slice``
replicated or split        partial                              impossible (ReshardError)
=========================  ===================================  ==========================

Only the minor axis of a dimension can leave it, and a new axis always joins at the minor
end: that is what keeps every intermediate a valid placement (gathering the major axis of a
dimension split twice would interleave pieces that no placement describes). So a dimension
split by several axes is gathered minor axis first and sliced major axis first.

The planner searches the placements reachable by such steps (over the axes that ``have``
or ``want`` mention) for the sequence with the least cost: the bytes sent per rank, as the
op records' ``cost`` counts them, plus a fixed ``CALL_BYTES`` per collective (an
alpha-beta model: a call costs time before any data moves), then the fewest steps. The
search is what puts a ``reduce_scatter`` before an ``all_gather`` (the gather then moves a
smaller value), a ``shard_slice`` before an ``all_gather`` over another axis, prefers one
``all_to_all`` to a gather followed by a slice, and reduces a tiny pending sum over two
axes with two all_reduces rather than reduce_scatter, all_reduce and all_gather.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError
from ..ir.dtypes import DType
from ..ir.graph import Value
from ..ir.types import TensorType
from ..ops.registry import OPS
from ..ir.mesh import Mesh
from ..ir.placement import Placement


class ReshardError(PartitaError):
    """A reshard that cannot be done (the message names the tensor, the axis and why)."""


@dataclass(frozen=True)
class Step:
    """One collective of a reshard plan, as every rank issues it.

    ``before`` and ``after`` are the local shapes (what one rank holds) around the op,
    ``placement`` the placement of the value after it, ``bytes_sent`` what each rank sends
    (the op record's ``cost(...).bytes_written``).
    """

    op: str
    attrs: dict[str, Any] = field(hash=False)
    before: tuple[int, ...]
    after: tuple[int, ...]
    bytes_sent: int
    placement: Placement

    @property
    def axis(self) -> str:
        return self.attrs["axis"]

    def __str__(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self.attrs.items() if k not in ("axis", "group_size", "op"))
        return (f"{self.op} over {self.axis}{' (' + extra + ')' if extra else ''}: "
                f"{list(self.before)} -> {list(self.after)}, {self.bytes_sent} bytes sent per rank")


# What one collective call costs beyond its bytes, counted as bytes (the alpha of an
# alpha-beta model): a gloo call over loopback takes some 50 to 100 us before its data moves,
# about what 64 KiB take at 1 GB/s. The planner minimizes bytes sent plus this per call, so
# a tiny value takes the plan with fewer calls, and a large one the plan with fewer bytes.
CALL_BYTES = 64 * 1024


def plan_bytes(steps: Sequence[Step]) -> int:
    """The bytes each rank sends over a whole plan."""
    return sum(s.bytes_sent for s in steps)


def plan_cost(steps: Sequence[Step]) -> int:
    """What the planner minimizes: the bytes sent plus ``CALL_BYTES`` per collective."""
    return plan_bytes(steps) + CALL_BYTES * len(steps)


def plan_reshard(shape: Sequence[int], dtype: DType, have: Placement, want: Placement, mesh: Mesh | str,
                 what: str = "the tensor") -> list[Step]:
    """The cheapest steps that turn a value of global ``shape`` placed as ``have`` into ``want``.

    Cheapest means the least ``plan_cost``: bytes sent per rank plus ``CALL_BYTES`` per
    collective (then the fewest steps). Every intermediate
    placement is valid on ``mesh``. ``what`` names the value in error messages (``%x``).
    Raises PlacementError when either placement does not fit the shape or the mesh, and
    ReshardError when ``want`` cannot be reached (a partial sum cannot be created).
    """
    mesh = Mesh.of(mesh)
    shape = tuple(shape)
    key = (shape, dtype, have, want, mesh)
    got = _PLANS.get(key)
    if got is None:
        got = _plan_reshard(shape, dtype, have, want, mesh, what)
        if len(_PLANS) >= 1 << 14:
            _PLANS.clear()
        _PLANS[key] = got
    return list(got)


# plan_reshard's plans by (shape, dtype, have, want, mesh): a partition of a pipeline rank's
# template asks for the same few hundred plans (every layer alike). Failures are not kept.
_PLANS: "dict[tuple, list[Step]]" = {}


def _plan_reshard(shape: tuple[int, ...], dtype: DType, have: Placement, want: Placement, mesh: Mesh,
                  what: str) -> list[Step]:
    """``plan_reshard``'s search (not memoized)."""
    have.validate(shape, mesh, f"{what} (placed as the reshard's source {have})")
    want.validate(shape, mesh, f"{what} (placed as the reshard's target {want})")
    new_partial = [a for a in want.partial if a not in have.partial]
    if new_partial:
        a = new_partial[0]
        now = _axis_state(have, a)
        raise ReshardError(
            f"cannot reshard {what} from {have} to {want}: the target is a pending sum over mesh axis '{a}', "
            f"but along '{a}' the value is {now}; no collective turns a value into summands. Let the "
            f"consumer take the value as it is along '{a}', or produce it partial over '{a}' in the first place")
    to_reduce = [a for a in have.partial if a not in want.partial]
    if to_reduce and dtype.is_bool:
        raise ReshardError(
            f"cannot reshard {what} from {have} to {want}: it is a pending sum over '{to_reduce[0]}' of a bool "
            "tensor, and sums are not defined on bool; cast it to an integer dtype before the reduction")
    if have == want:
        return []

    # Axes that are partial in both stay so: reducing them could never be undone.
    frozen = set(have.partial) & set(want.partial)
    axes = [a for a in mesh.names if a not in frozen and (a in have.axes_used() or a in want.axes_used())]
    start, goal = have, want
    tie = itertools.count()
    best: dict[Placement, tuple[int, int]] = {start: (0, 0)}
    came: dict[Placement, tuple[Placement, Step]] = {}
    heap: list[tuple[int, int, int, Placement]] = [(0, 0, next(tie), start)]
    while heap:
        cost, nsteps, _, p = heapq.heappop(heap)
        if best.get(p) != (cost, nsteps):
            continue
        if p == goal:
            plan: list[Step] = []
            while p != start:
                p, step = came[p]
                plan.append(step)
            return plan[::-1]
        local = p.local_shape(shape, mesh)
        for step in _moves(p, local, shape, dtype, axes, mesh):
            key = (cost + step.bytes_sent + CALL_BYTES, nsteps + 1)
            q = step.placement
            if q not in best or key < best[q]:
                best[q] = key
                came[q] = (p, step)
                heapq.heappush(heap, (key[0], key[1], next(tie), q))
    raise ReshardError(  # every valid target without a new partial sum is reachable; this is a bug
        f"found no sequence of collectives from {have} to {want} for {what} (shape {list(shape)}) on {mesh}")


def _axis_state(p: Placement, axis: str) -> str:
    for d, axes in enumerate(p.dims):
        if axis in axes:
            return f"split along dim {d}"
    return "a pending sum" if axis in p.partial else "replicated"


def _moves(p: Placement, local: tuple[int, ...], shape: tuple[int, ...], dtype: DType, axes: list[str],
           mesh: Mesh) -> Iterator[Step]:
    """Every single-collective step from ``p`` that leads to a valid placement."""
    dims = [list(d) for d in p.dims]
    for a in axes:
        n = mesh.axis_size(a)
        if a in p.partial:
            rest = tuple(x for x in p.partial if x != a)
            yield _step("all_reduce", dict(axis=a, group_size=n), local, dtype, Placement(p.dims, rest))
            for d in range(len(dims)):
                if local[d] % n == 0:
                    yield _step("reduce_scatter", dict(axis=a, group_size=n, dim=d), local, dtype,
                                _with(dims, add=(d, a), partial=rest))
            continue
        held = next((d for d, ax in enumerate(dims) if a in ax), None)
        if held is None:
            for d in range(len(dims)):
                if local[d] % n == 0:
                    yield _step("shard_slice", dict(axis=a, group_size=n, dim=d), local, dtype,
                                _with(dims, add=(d, a), partial=p.partial))
        elif dims[held][-1] == a:
            yield _step("all_gather", dict(axis=a, group_size=n, dim=held), local, dtype,
                        _with(dims, remove=held, partial=p.partial))
            for d in range(len(dims)):
                if d != held and local[d] % n == 0:
                    yield _step("all_to_all", dict(axis=a, group_size=n, split_dim=d, concat_dim=held), local,
                                dtype, _with(dims, remove=held, add=(d, a), partial=p.partial))


def _with(dims: list[list[str]], *, partial: tuple[str, ...], add: tuple[int, str] | None = None,
          remove: int | None = None) -> Placement:
    out = [list(d) for d in dims]
    if remove is not None:
        out[remove].pop()
    if add is not None:
        out[add[0]].append(add[1])
    return Placement(tuple(tuple(d) for d in out), partial)


def _step(op: str, attrs: dict[str, Any], local: tuple[int, ...], dtype: DType, after: Placement) -> Step:
    opdef = OPS[op]
    norm = opdef.normalize_attrs(attrs)
    t = TensorType(local, dtype)
    (out,) = opdef.infer_types([t], norm)
    sent = opdef.cost([t], [out], norm).bytes_written
    return Step(op, norm, local, out.shape, sent, after)


def apply_reshard(builder: Builder, value: Value, steps: Sequence[Step]) -> Value:
    """Emit ``steps`` on ``value`` (a per-rank value of the first step's local shape) with
    ``builder``; returns the resharded value (``value`` itself for an empty plan)."""
    for step in steps:
        if value.type.shape != step.before:
            raise ReshardError(
                f"apply_reshard: step '{step}' expects a local value of shape {list(step.before)}, but "
                f"%{value.name or '?'} has type {value.type}; plan the reshard with the shape and placement of this value")
        value = builder.emit_node(step.op, [value], dict(step.attrs)).results[0]
    return value
