"""Collective ops: communication between the ranks of one mesh axis in a per-rank program.

A per-rank (SPMD) program is an ordinary graph with local shapes; these ops are where ranks
talk. Every record carries ``axis`` (the mesh axis whose groups communicate) and
``group_size`` (the number of ranks along it; the type rules need it for shape changes, and
it must equal the mesh's size of that axis). Types are LOCAL: the operand is what one rank
holds, the result what that rank gets back.

- ``all_reduce(x) {axis, group_size, op="sum"}``: every member gets the reduction of all.
- ``all_gather(x) {axis, group_size, dim}``: the members' pieces concatenated along ``dim``
  in group order (``dim`` grows by ``group_size``).
- ``reduce_scatter(x) {axis, group_size, dim, op="sum"}``: the reduction, split along ``dim``
  into ``group_size`` pieces; member i gets piece i.
- ``all_to_all(x) {axis, group_size, split_dim, concat_dim}``: each member splits its value
  along ``split_dim`` into ``group_size`` pieces; member j gets piece j of every member,
  concatenated along ``concat_dim`` in member order.
- ``broadcast(x) {axis, group_size, root=0}``: everyone gets member ``root``'s value (``root``
  is a position in the group, not a global rank).
- ``shard_slice(x) {axis, group_size, dim}``: member i keeps piece i of its own value split
  along ``dim`` (replicated -> split; nothing is sent, but the result depends on the rank).
- ``axis_index() {axis, group_size}``: member i gets i, an i64 scalar (nothing is sent).
- ``ring_shift(x) {axis, group_size, shift=1}``: member i gets member ``(i - shift) mod n``'s
  value (each sends its value ``shift`` places forward around the ring; ring attention).

``op`` is one of sum, max, min, avg (avg needs a float dtype). Members are ordered by their
coordinate along the axis.

Point-to-point, for pipeline stages (MPMD programs, each rank its own graph), at the end of
this module: ``send(x) {axis, group_size, peer}`` (no result) and ``recv() {axis, group_size,
peer, shape, dtype}``. ``peer`` is the absolute coordinate along ``axis`` of the other rank,
within this rank's group. They are not group-wide: their effect is {"p2p"} and their
``collective`` field is None; ``run_mesh`` pairs each send with its peer's recv.

The semantics over a whole group are each record's ``collective`` function (NumPy), run by
``partita.parallel.interpreter.run_mesh``. The single-process ``reference`` only covers a group
of one rank. The ``torch`` implementations call ``torch.distributed`` on the group that
this process's table holds for the axis (process_groups.py, filled in through
``partita.parallel.comm``). All are effectful ({"collective"}): passes
never drop, merge or reorder them, since every rank of a group must issue the same
collectives in the same order.

Costs are per rank with ring algorithms (n = group_size, S = the bytes of the larger of the
operand and the result): ``bytes_written`` counts the bytes a rank sends, ``bytes_read`` the
bytes it receives, ``flops`` the reduction arithmetic. all_reduce moves 2(n-1)/n S each way,
all_gather, reduce_scatter and all_to_all (n-1)/n S; broadcast S (pipelined along the ring);
ring_shift S (one value to one neighbour).
"""

from __future__ import annotations

import time

from typing import Any, Callable

import numpy as np

from ..ir.diagnostics import ExecutionError, TypeRuleError
from ..ir.dtypes import i64
from ..ir.types import TensorType
from .numeric import LOW_PRECISION
from ._lazy import carrier_dtype, torch
from .process_groups import group
from .registry import OPS, AttrSpec, Cost, OpDef, normalize_axis, register

REDUCE_OPS = ("sum", "max", "min", "avg")

_LOW_PRECISION = LOW_PRECISION

_GROUP_ATTRS = (AttrSpec("axis", "str"), AttrSpec("group_size", "int"))


def _where(name: str, attrs: dict) -> str:
    return f"{name} over axis {attrs['axis']} ({attrs['group_size']} ranks)"


# --- type rules -------------------------------------------------------------------------

def _check_group(name: str, t: TensorType, attrs: dict) -> int:
    n = attrs["group_size"]
    if n < 1:
        raise TypeRuleError(f"{name}: group_size must be at least 1 (the number of ranks along mesh axis "
                            f"{attrs['axis']}), got {n}")
    if not attrs["axis"]:
        raise TypeRuleError(f"{name}: axis must name a mesh axis (e.g. axis=\"tp\"), got an empty string")
    return n


def _check_reduce(name: str, t: TensorType, attrs: dict) -> None:
    op = attrs["op"]
    if t.dtype.is_bool:
        raise TypeRuleError(f"{_where(name, attrs)}: op={op} is not defined on bool tensors ({t}); cast to an "
                            "integer or float dtype first")
    if op == "avg" and not t.dtype.is_float:
        raise TypeRuleError(f"{_where(name, attrs)}: op=avg needs a float tensor, got {t}; cast it to a float "
                            "dtype first or use op=sum")


def _split_size(name: str, what: str, shape: tuple[int, ...], dim: int, attrs: dict) -> int:
    n, size = attrs["group_size"], shape[dim]
    if size % n:
        raise TypeRuleError(
            f"{name}: {what} {dim} has size {size}, which does not split into group_size={n} equal pieces "
            f"(one per rank along axis {attrs['axis']}); pad that dim to a multiple of {n} or choose another")
    return size // n


def _all_reduce_infer(ts, attrs):
    (t,) = ts
    _check_group("all_reduce", t, attrs)
    _check_reduce("all_reduce", t, attrs)
    return t


def _all_gather_infer(ts, attrs):
    (t,) = ts
    n = _check_group("all_gather", t, attrs)
    d = normalize_axis(attrs["dim"], t.rank, "all_gather", "dim")
    shape = list(t.shape)
    shape[d] *= n
    return TensorType(tuple(shape), t.dtype)


def _one_piece(op: str, t: TensorType, attrs) -> TensorType:
    """``t`` with ``dim`` cut into group_size pieces: the type of the piece a member keeps."""
    d = normalize_axis(attrs["dim"], t.rank, op, "dim")
    shape = list(t.shape)
    shape[d] = _split_size(op, "dim", t.shape, d, attrs)
    return TensorType(tuple(shape), t.dtype)


def _reduce_scatter_infer(ts, attrs):
    (t,) = ts
    _check_group("reduce_scatter", t, attrs)
    _check_reduce("reduce_scatter", t, attrs)
    return _one_piece("reduce_scatter", t, attrs)


def _all_to_all_infer(ts, attrs):
    (t,) = ts
    n = _check_group("all_to_all", t, attrs)
    s = normalize_axis(attrs["split_dim"], t.rank, "all_to_all", "split_dim")
    c = normalize_axis(attrs["concat_dim"], t.rank, "all_to_all", "concat_dim")
    shape = list(t.shape)
    shape[s] = _split_size("all_to_all", "split_dim", t.shape, s, attrs)
    shape[c] *= n
    return TensorType(tuple(shape), t.dtype)


def _broadcast_infer(ts, attrs):
    (t,) = ts
    n = _check_group("broadcast", t, attrs)
    if not 0 <= attrs["root"] < n:
        raise TypeRuleError(f"broadcast: root {attrs['root']} is not a member of a group of {n} ranks along axis "
                            f"{attrs['axis']}; root is a position in the group, 0..{n - 1}")
    return t


# --- NumPy semantics over a group --------------------------------------------------------

def _reduce_np(values: list[np.ndarray], op: str) -> np.ndarray:
    """The reduction of the members' arrays, in group order; f16/bf16 in f32, rounded once."""
    dtype = values[0].dtype
    vals = [v.astype(np.float32) if v.dtype in _LOW_PRECISION else v for v in values]
    acc = vals[0].copy()
    with np.errstate(all="ignore"):
        for v in vals[1:]:
            if op in ("sum", "avg"):
                acc = acc + v
            elif op == "max":
                acc = np.maximum(acc, v)
            else:
                acc = np.minimum(acc, v)
        if op == "avg":
            acc = acc / len(vals)
    return np.asarray(acc).astype(dtype)


def _firsts(args_by_member: list[list[np.ndarray]], name: str, attrs: dict) -> list[np.ndarray]:
    n = attrs["group_size"]
    if len(args_by_member) != n:
        raise ExecutionError(f"{_where(name, attrs)}: got the operands of {len(args_by_member)} members, "
                             f"expected one per rank of the group ({n})")
    return [np.asarray(args[0]) for args in args_by_member]


def _all_reduce_np(args_by_member, attrs):
    xs = _firsts(args_by_member, "all_reduce", attrs)
    r = _reduce_np(xs, attrs["op"])
    return [r.copy() for _ in xs]


def _all_gather_np(args_by_member, attrs):
    xs = _firsts(args_by_member, "all_gather", attrs)
    d = attrs["dim"] % xs[0].ndim
    r = np.concatenate(xs, axis=d)
    return [r.copy() for _ in xs]


def _reduce_scatter_np(args_by_member, attrs):
    xs = _firsts(args_by_member, "reduce_scatter", attrs)
    d = attrs["dim"] % xs[0].ndim
    pieces = np.split(_reduce_np(xs, attrs["op"]), len(xs), axis=d)
    return [p.copy() for p in pieces]


def _all_to_all_np(args_by_member, attrs):
    xs = _firsts(args_by_member, "all_to_all", attrs)
    s, c = attrs["split_dim"] % xs[0].ndim, attrs["concat_dim"] % xs[0].ndim
    pieces = [np.split(x, len(xs), axis=s) for x in xs]  # pieces[i][j]: from member i to member j
    return [np.concatenate([pieces[i][j] for i in range(len(xs))], axis=c) for j in range(len(xs))]


def _broadcast_np(args_by_member, attrs):
    xs = _firsts(args_by_member, "broadcast", attrs)
    return [xs[attrs["root"]].copy() for _ in xs]


def _single_rank_reference(name: str, collective):
    """The plain reference: a group of one rank is the group semantics on one member; a
    larger group cannot be computed from one rank's operands."""
    def reference(args, attrs):
        if attrs["group_size"] != 1:
            raise ExecutionError(
                f"{name} is a collective over axis {attrs['axis']} ({attrs['group_size']} ranks): run the per-rank "
                "program with partita.parallel.interpreter.run_mesh, or launch it on a process group")
        return collective([list(args)], attrs)[0]
    return reference


# --- torch.distributed ---------------------------------------------------------------------

def _dist():
    import torch.distributed as dist
    return dist


def _group(name: str, attrs: dict):
    dist = _dist()
    g = group(attrs["axis"])
    size = dist.get_world_size(g)
    if size != attrs["group_size"]:
        raise ExecutionError(f"{_where(name, attrs)}: this rank's process group for axis {attrs['axis']} has "
                             f"{size} ranks; the program was built for a mesh whose {attrs['axis']} axis has "
                             f"{attrs['group_size']}")
    return g


def _reduce_op(op: str):
    r = _dist().ReduceOp
    return {"sum": r.SUM, "max": r.MAX, "min": r.MIN, "avg": r.AVG}[op]


def _all_gather_flat(out, inp, g, async_op: bool = False):
    # Flat 1-D buffers: gloo rejects the stacked (n, ...) output form, and takes the flat one.
    dist = _dist()
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=g, async_op=async_op)


def _stack_pieces(x, n: int, dim: int):
    """``x`` split along ``dim`` into ``n`` pieces, laid out piece after piece in one flat buffer."""
    return torch.stack(torch.chunk(x, n, dim=dim)).contiguous().reshape(-1)


def _all_reduce_torch(args, attrs):
    res = _all_reduce_torch_async(args, attrs)
    return res.result() if type(res) is Pending else res


class Pending:
    """A collective in flight: ``result()`` waits for it and returns its tensor (passed
    through ``finish`` when the received buffer needs rearranging, as an all_gather along a
    dim other than 0 does). ``keep`` holds the send buffer until the transfer is done.
    ``on_error`` (set by the runtime) turns a failure into the error that names the
    collective."""

    __slots__ = ("tensor", "work", "on_error", "finish", "keep", "waited")

    def __init__(self, tensor, work, finish=None, keep=None) -> None:
        self.tensor = tensor
        self.work = work
        self.on_error: Callable[[BaseException], Any] | None = None
        self.finish = finish
        self.keep = keep
        # A one-element list the seconds spent waiting are added to (set by the runtime to
        # measure a pipeline's time in recvs), or None.
        self.waited: list[float] | None = None

    def result(self):
        t0 = time.perf_counter() if self.waited is not None else 0.0
        try:
            self.work.wait()
        except Exception as e:
            if self.on_error is not None:
                self.on_error(e)
            raise
        if self.waited is not None:
            self.waited[0] += time.perf_counter() - t0
        self.keep = None
        return self.tensor if self.finish is None else self.finish(self.tensor)


def _all_reduce_torch_async(args, attrs):
    (x,) = args
    if attrs["group_size"] == 1:
        return x.clone()
    g = _group("all_reduce", attrs)
    y = x.clone(memory_format=torch.contiguous_format)
    return Pending(y, _dist().all_reduce(y, op=_reduce_op(attrs["op"]), group=g, async_op=True))


def _all_gather_torch(args, attrs):
    res = _all_gather_torch_async(args, attrs)
    return res.result() if type(res) is Pending else res


def _all_gather_torch_async(args, attrs):
    (x,) = args
    n = attrs["group_size"]
    if n == 1:
        return x.clone()
    g = _group("all_gather", attrs)
    d = attrs["dim"] % x.dim()
    shape = tuple(x.shape)
    out = torch.empty(n * x.numel(), dtype=x.dtype, device=x.device)
    inp = x.contiguous().reshape(-1)
    work = _all_gather_flat(out, inp, g, async_op=True)

    def finish(flat):
        # The members' pieces arrive one after another: along dim 0 that is the result as
        # it is; along another dim the pieces are concatenated there.
        if d == 0:
            return flat.view((n * shape[0],) + shape[1:])
        return torch.cat(flat.view((n,) + shape).unbind(0), dim=d)
    return Pending(out, work, finish, inp)


def _reduce_scatter_torch(args, attrs):
    res = _reduce_scatter_torch_async(args, attrs)
    return res.result() if type(res) is Pending else res


def _reduce_scatter_torch_async(args, attrs):
    """The reduce_scatter started asynchronously: a ``Pending`` whose ``result()`` waits and
    gives the rank's piece."""
    (x,) = args
    n = attrs["group_size"]
    if n == 1:
        return x.clone()
    g = _group("reduce_scatter", attrs)
    d = attrs["dim"] % x.dim()
    piece = list(x.shape)
    piece[d] //= n
    out = torch.empty(x.numel() // n, dtype=x.dtype, device=x.device)
    inp = _stack_pieces(x, n, d)
    dist = _dist()
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    work = fn(out, inp, op=_reduce_op(attrs["op"]), group=g, async_op=True)
    # The stacked layout keeps each piece in x's own dim order, so the result views back as is.
    return Pending(out, work, lambda flat: flat.view(piece), inp)


def _all_to_all_torch(args, attrs):
    (x,) = args
    n = attrs["group_size"]
    if n == 1:
        return x.clone()
    g = _group("all_to_all", attrs)
    s, c = attrs["split_dim"] % x.dim(), attrs["concat_dim"] % x.dim()
    piece = list(x.shape)
    piece[s] //= n
    out = torch.empty(x.numel(), dtype=x.dtype, device=x.device)
    _dist().all_to_all_single(out, _stack_pieces(x, n, s), group=g)
    return torch.cat(out.view(n, *piece).unbind(0), dim=c)


def _broadcast_torch(args, attrs):
    (x,) = args
    if attrs["group_size"] == 1:
        return x.clone()
    dist = _dist()
    g = _group("broadcast", attrs)
    y = x.clone(memory_format=torch.contiguous_format)  # broadcast writes into its tensor
    dist.broadcast(y, src=dist.get_global_rank(g, attrs["root"]), group=g)
    return y


# --- costs ---------------------------------------------------------------------------------

def _ring_cost(steps_num: int, steps_den: int, reduces: bool):
    """Per-rank ring cost: each rank sends and receives ``steps_num/steps_den * (n-1)/n`` of
    the larger of operand and result; a reduction adds one FLOP per received element."""
    def cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
        n = attrs["group_size"]
        big = max(ins[0], outs[0], key=lambda t: t.numel)
        moved = big.nbytes * steps_num * (n - 1) // (n * steps_den)
        flops = 0
        if reduces:
            # reduce phase: (n-1)/n of the elements combined once; avg divides the local result.
            flops = big.numel * (n - 1) // n + (outs[0].numel if attrs["op"] == "avg" and n > 1 else 0)
        return Cost(flops=flops, bytes_read=moved, bytes_written=moved)
    return cost


def _broadcast_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    # Pipelined along the ring: a middle rank receives the whole value and forwards it.
    moved = ins[0].nbytes if attrs["group_size"] > 1 else 0
    return Cost(0, moved, moved)


# --- records -------------------------------------------------------------------------------

_EFFECTS = frozenset({"collective"})


def _collective(name: str, infer, collective, torch_impl, attrs, cost, doc: str, torch_async=None) -> OpDef:
    return register(OpDef(
        name=name, operands=("x",), infer=infer, reference=_single_rank_reference(name, collective),
        torch=torch_impl, attrs=_GROUP_ATTRS + attrs, effects=_EFFECTS, cost=cost, collective=collective,
        doc=doc, torch_async=torch_async))


_REDUCE_ATTR = AttrSpec("op", "str", "sum", choices=REDUCE_OPS)

_collective("all_reduce", _all_reduce_infer, _all_reduce_np, _all_reduce_torch, (_REDUCE_ATTR,),
            _ring_cost(2, 1, True), "every rank of the group gets the reduction (op) of all members' values",
            torch_async=_all_reduce_torch_async)
_collective("all_gather", _all_gather_infer, _all_gather_np, _all_gather_torch, (AttrSpec("dim", "int"),),
            _ring_cost(1, 1, False), "the members' values concatenated along dim in group order",
            torch_async=_all_gather_torch_async)
_collective("reduce_scatter", _reduce_scatter_infer, _reduce_scatter_np, _reduce_scatter_torch,
            (AttrSpec("dim", "int"), _REDUCE_ATTR), _ring_cost(1, 1, True),
            "the reduction (op) split along dim into group_size pieces; member i gets piece i",
            torch_async=_reduce_scatter_torch_async)
_collective("all_to_all", _all_to_all_infer, _all_to_all_np, _all_to_all_torch,
            (AttrSpec("split_dim", "int"), AttrSpec("concat_dim", "int")), _ring_cost(1, 1, False),
            "each member splits along split_dim; member j gets piece j of every member, concatenated "
            "along concat_dim in member order")
_collective("broadcast", _broadcast_infer, _broadcast_np, _broadcast_torch, (AttrSpec("root", "int", 0),),
            _broadcast_cost, "every member gets the value of member root (a position in the group)")


# --- ring_shift: every member hands its value to the next one around the ring --------------------
# Ring attention passes blocks of keys and values around the cp ring: each step, every
# member sends its block to the member ``shift`` places after it and receives the block of
# the member ``shift`` places before it. All members take part at once, so it is a
# collective (one in the group's sequence), though each rank talks to two peers only.

def _ring_shift_infer(ts, attrs):
    (t,) = ts
    n = _check_group("ring_shift", t, attrs)
    if not 0 < attrs["shift"] < max(n, 2):
        raise TypeRuleError(f"{_where('ring_shift', attrs)}: shift={attrs['shift']} must be 1..group_size-1 (the "
                            "number of places a value moves forward around the ring)")
    return t


def _ring_shift_np(args_by_member, attrs):
    xs = _firsts(args_by_member, "ring_shift", attrs)
    n, k = len(xs), attrs["shift"]
    return [xs[(i - k) % n].copy() for i in range(n)]


class _AllWorks:
    """The works of one batch of point-to-point transfers, waited for together."""

    def __init__(self, works) -> None:
        self.works = list(works)

    def wait(self) -> None:
        for w in self.works:
            w.wait()


def _ring_shift_torch(args, attrs):
    res = _ring_shift_torch_async(args, attrs)
    return res.result() if type(res) is Pending else res


def _ring_shift_torch_async(args, attrs):
    """The send to the next member and the receive from the previous one, in flight together;
    the program waits where the received block is first read."""
    (x,) = args
    n = attrs["group_size"]
    if n == 1:
        return x.clone()
    dist = _dist()
    g = _group("ring_shift", attrs)
    me = dist.get_group_rank(g, dist.get_rank())
    dst = dist.get_global_rank(g, (me + attrs["shift"]) % n)
    src = dist.get_global_rank(g, (me - attrs["shift"]) % n)
    # A copy to send: a later node may update x's buffer in place while the transfer runs.
    buf = x.detach().clone(memory_format=torch.contiguous_format)
    out = torch.empty_like(buf)
    ops = [dist.P2POp(dist.isend, buf, dst, group=g), dist.P2POp(dist.irecv, out, src, group=g)]
    return Pending(out, _AllWorks(dist.batch_isend_irecv(ops)), keep=buf)


def _ring_shift_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    # Each rank sends its whole value once and receives one of the same size.
    moved = ins[0].nbytes if attrs["group_size"] > 1 else 0
    return Cost(0, moved, moved)


_collective("ring_shift", _ring_shift_infer, _ring_shift_np, _ring_shift_torch, (AttrSpec("shift", "int", 1),),
            _ring_shift_cost, "member i gets the value of member (i - shift) mod group_size: every member "
            "hands its value shift places forward around the ring (ring attention's K/V step)",
            torch_async=_ring_shift_torch_async)


# --- shard_slice: the replicated -> split transition ------------------------------------------
# Every rank already holds the whole value, so each keeps its own piece and nothing moves.
# It is still rank-dependent (the piece is the rank's coordinate along ``axis``), so it is a
# collective by declaration: passes must neither merge two ranks' slices nor hoist one out
# of the place the reshard planner put it.

def _shard_slice_infer(ts, attrs):
    (t,) = ts
    _check_group("shard_slice", t, attrs)
    return _one_piece("shard_slice", t, attrs)


def _shard_slice_np(args_by_member, attrs):
    xs = _firsts(args_by_member, "shard_slice", attrs)
    d = attrs["dim"] % xs[0].ndim
    return [np.split(x, len(xs), axis=d)[i].copy() for i, x in enumerate(xs)]


def _shard_slice_torch(args, attrs):
    (x,) = args
    n = attrs["group_size"]
    if n == 1:
        return x.clone()
    dist = _dist()
    g = _group("shard_slice", attrs)
    # The group rank is the coordinate along the axis (comm.new_mesh_groups keeps them equal).
    coord = dist.get_group_rank(g, dist.get_rank())
    return torch.chunk(x, n, dim=attrs["dim"] % x.dim())[coord].clone(memory_format=torch.contiguous_format)


def _shard_slice_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    return Cost(0, 0, 0)  # a local view: no rank sends or receives anything


_collective("shard_slice", _shard_slice_infer, _shard_slice_np, _shard_slice_torch, (AttrSpec("dim", "int"),),
            _shard_slice_cost, "every member keeps piece i (i = its coordinate along axis) of its value split "
            "along dim into group_size pieces; no communication")


# --- axis_index: a rank's coordinate along one mesh axis -----------------------------------------
# A per-rank program whose local work depends on which piece a rank holds (a vocab-parallel
# embedding looks up only the rows of its range) needs that piece's position at run time.
# Like shard_slice it sends nothing, and like shard_slice it is a collective by declaration:
# its value differs between ranks, so passes must not merge it with anything or move it out
# of the order every member issues.

def _axis_index_infer(ts, attrs):
    _check_group("axis_index", TensorType((), i64), attrs)
    return TensorType((), i64)


def _axis_index_np(args_by_member, attrs):
    n = attrs["group_size"]
    if len(args_by_member) != n:
        raise ExecutionError(f"{_where('axis_index', attrs)}: got {len(args_by_member)} members, expected one per "
                             f"rank of the group ({n})")
    return [np.asarray(i, dtype=np.int64) for i in range(n)]


def _axis_index_torch(args, attrs):
    if attrs["group_size"] == 1:
        return torch.zeros((), dtype=torch.int64)
    dist = _dist()
    g = _group("axis_index", attrs)
    # The group rank is the coordinate along the axis (comm.new_mesh_groups keeps them equal).
    return torch.tensor(dist.get_group_rank(g, dist.get_rank()), dtype=torch.int64)


register(OpDef(
    name="axis_index", operands=(), infer=_axis_index_infer,
    reference=_single_rank_reference("axis_index", _axis_index_np), torch=_axis_index_torch,
    attrs=_GROUP_ATTRS, effects=_EFFECTS, cost=lambda ins, outs, a: Cost(0, 0, 0), collective=_axis_index_np,
    doc="this rank's coordinate along axis (0..group_size-1), an i64 scalar; no communication"))


# --- send / recv: point-to-point between two ranks of one axis group ---------------------------
# A pipeline stage hands its activations to the next stage and gets gradients back: only two
# ranks of the axis group take part, so these are not collectives (no group semantics, not
# in a group's collective sequence). ``peer`` is the other rank's absolute coordinate along
# ``axis`` (as broadcast's ``root``): stage programs are written per stage, so the absolute
# form says directly which stage a tensor goes to, and one text means the same on every
# rank of a stage. The effect "p2p" keeps DCE from dropping a send (it has no result for
# anything to use) and CSE from merging two sends or two recvs of the same type; passes that
# reorder keep effectful nodes in their relative order, which is what pairing relies on.

P2P_EFFECT = "p2p"
_P2P_EFFECTS = frozenset({P2P_EFFECT})
# ``tag``: what the transfer is for, in words (a pipeline names the schedule action:
# "activations of F3, chunk 0 -> 1"); only error messages and reports read it.
_PEER_ATTRS = _GROUP_ATTRS + (AttrSpec("peer", "int"), AttrSpec("tag", "str", ""))


def is_point_to_point(node) -> bool:
    """True for a node whose op record declares the "p2p" effect (send, recv): it talks to
    one peer rank of its axis group, named by ``peer``, and is paired rather than group-wide.
    A send has one operand and no result, a recv no operand and one result."""
    d = OPS.get(node.op)
    if d is None:
        return False
    e = d.effects
    # Most records declare a fixed set: no call for them (passes ask this of every node).
    return P2P_EFFECT in (e(node.attrs) if callable(e) else e)


def _check_peer(name: str, attrs: dict) -> None:
    n, axis, peer = attrs["group_size"], attrs["axis"], attrs["peer"]
    if not axis:
        raise TypeRuleError(f"{name}: axis must name a mesh axis (e.g. axis=\"pp\"), got an empty string")
    if n < 2:
        raise TypeRuleError(f"{name} over axis {axis}: group_size={n} leaves no other rank to "
                            f"{'send to' if name == 'send' else 'receive from'}; a point-to-point op needs a group "
                            "of at least 2 ranks (drop it when the axis has one rank)")
    if not 0 <= peer < n:
        raise TypeRuleError(f"{name} over axis {axis} ({n} ranks): peer={peer} is not a coordinate along the axis; "
                            f"peer is the other rank's position in the group, 0..{n - 1}")


def _send_infer(ts, attrs):
    _check_peer("send", attrs)
    return []


def _recv_infer(ts, attrs):
    _check_peer("recv", attrs)
    shape = attrs["shape"]
    if any(d < 0 for d in shape):
        raise TypeRuleError(f"recv over axis {attrs['axis']}: shape {list(shape)} has a negative dim; give the "
                            "shape of the tensor the peer sends")
    return TensorType(tuple(shape), attrs["dtype"])


def _p2p_reference(name: str):
    def reference(args, attrs):
        raise ExecutionError(
            f"{name} is point-to-point over axis {attrs['axis']} (peer {attrs['peer']} of {attrs['group_size']} "
            "ranks): run the per-rank programs with partita.parallel.interpreter.run_mesh (one graph per rank), or "
            "launch them with partita.runtime.run_ranks")
    return reference


def _peer_rank(name: str, attrs: dict):
    """(group, the peer's global rank); refuses a peer that is this rank itself, which would
    wait for ever on a blocking transport."""
    dist = _dist()
    g = _group(name, attrs)
    me = dist.get_group_rank(g, dist.get_rank())
    if attrs["peer"] == me:
        raise ExecutionError(f"{name} over axis {attrs['axis']}: peer={attrs['peer']} is this rank's own coordinate "
                             f"(global rank {dist.get_rank()}); a rank cannot "
                             f"{'send to' if name == 'send' else 'receive from'} itself")
    return g, dist.get_global_rank(g, attrs["peer"])


def _send_torch(args, attrs):
    (x,) = args
    g, dst = _peer_rank("send", attrs)
    _dist().send(x.contiguous(), dst=dst, group=g)
    return ()


def _recv_torch(args, attrs):
    g, src = _peer_rank("recv", attrs)
    # The peer sends the executor's carrier of the dtype (u16 lives in int32, ...), so the
    # buffer is the same carrier.
    out = torch.empty(attrs["shape"], dtype=carrier_dtype(attrs["dtype"]))
    _dist().recv(out, src=src, group=g)
    return out


def _send_torch_async(args, attrs):
    """``isend`` of a copy of x (a later node may update x's buffer in place while the
    transfer is in flight); the executor waits for every send at the end of the program."""
    (x,) = args
    g, dst = _peer_rank("send", attrs)
    buf = x.detach().clone(memory_format=torch.contiguous_format)
    return Pending(None, _dist().isend(buf, dst=dst, group=g), keep=buf)


def _recv_torch_async(args, attrs):
    """``irecv``: the program goes on and waits where the tensor is first read."""
    g, src = _peer_rank("recv", attrs)
    out = torch.empty(attrs["shape"], dtype=carrier_dtype(attrs["dtype"]))
    return Pending(out, _dist().irecv(out, src=src, group=g))


def _send_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    return Cost(0, 0, ins[0].nbytes)


def _recv_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    return Cost(0, outs[0].nbytes, 0)


register(OpDef(
    name="send", operands=("x",), infer=_send_infer, reference=_p2p_reference("send"), torch=_send_torch,
    torch_async=_send_torch_async, attrs=_PEER_ATTRS, effects=_P2P_EFFECTS, cost=_send_cost,
    doc="send x to the rank of this rank's axis group whose coordinate along axis is peer; no result"))
register(OpDef(
    name="recv", operands=(), infer=_recv_infer, reference=_p2p_reference("recv"), torch=_recv_torch,
    torch_async=_recv_torch_async,
    attrs=_PEER_ATTRS + (AttrSpec("shape", "ints"), AttrSpec("dtype", "dtype")), effects=_P2P_EFFECTS,
    cost=_recv_cost, size_attrs=lambda a, outs: {**a, "shape": list(outs[0].shape)},
    # A padded recv receives the real rows and pads them with zeros (parallel/partition.py).
    pad_zeros="always", doc="receive a tensor of the given shape and dtype from the rank of this rank's axis group "
    "whose coordinate along axis is peer"))
