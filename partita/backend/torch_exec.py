"""The torch executor: runs a graph with each op record's torch implementation.

A graph is compiled once into a flat list of steps over numbered slots (no dict lookups or
attribute access per op at run time); slots are released after their last use.

Dtypes torch has few CPU kernels for live in a wider "carrier" (``_lazy.CARRIER_NAMES``):
u16/u32 in int32/int64, u64 in int64 as the same bits, storage types (f8, f4, i4, u4, i2,
u2) in f32 as their exact values. Only the nodes that touch such a dtype get a wrapper
(``_carried_step``); every other node runs its op's torch implementation directly.
Inputs are converted to carriers on the way in; outputs come back as torch.uint16/32/64
tensors, and storage-typed outputs as NumPy arrays of the ml_dtypes type (torch has no
4-bit or 2-bit dtypes), so both executors return the same values in the same dtypes.
"""

from __future__ import annotations

import contextlib
import weakref

from typing import Any, Mapping, Sequence

import numpy as np

from ..ir.diagnostics import ExecutionError, TypeRuleError
from ..ops.collective import Pending
from ..ir.dtypes import DType, promote_all
from ..ir.graph import Graph, Node, Value, input_name
from ..ops._lazy import CARRIER_NAMES, carrier_dtype, to_torch_dtype, torch
from ..ops.cast_semantics import cast_array, float_to_int_torch
from ..ops.registry import OPS, OpDef, movement_cost
from .common import bind_inputs, check_array, host_array, node_error, numpy_dtype_name, to_numpy


def async_form(opdef: OpDef) -> Any:
    """The asynchronous implementation ``TorchProgram(overlap=True)`` starts ``opdef``'s nodes
    with (a function returning a ``Pending``), or None: the op blocks where it stands."""
    return opdef.torch_async


def async_ops() -> frozenset[str]:
    """The ops ``TorchProgram(overlap=True)`` starts asynchronously and waits for where their
    result is first read (the simulator prices exactly these as overlapped)."""
    return frozenset(name for name, d in OPS.items() if async_form(d) is not None)


class TorchProgram:
    """A graph prepared for repeated execution with torch."""

    def __init__(self, graph: Graph, donate: bool = False, overlap: bool = False, device: Any = None,
                 kernels: Mapping[str, Any] | None = None) -> None:
        """``donate=True``: the caller gives up the input buffers that outputs alias (as a
        training loop does with its params and optimizer state), so ops with an in-place
        implementation may update them where they are instead of allocating new ones.
        ``overlap=True``: collectives with an asynchronous implementation (``async_form``:
        all_reduce, all_gather, reduce_scatter, ring_shift, send, recv) are started where they stand and
        waited for only where their result is first read, so the computation in between
        overlaps the transfer (a per-rank program under torch.distributed): zero3's param
        all_gathers, which order-collectives issues ``prefetch`` gathers ahead, are in flight
        while the params before them are used, and its gradient reduce_scatters while the
        backward goes on.
        ``device`` (e.g. ``"cuda:0"``; default the CPU): where the program computes. Inputs are
        moved there, tensors the ops create are made there (torch's default-device context
        is set around every call), and outputs stay there.
        ``kernels``: builders of other step functions by op name, ``(node, inplace) -> step or
        None`` (None: this node keeps its op's implementation); ``inplace`` says the node may
        write its results into its donated operands. partita.codegen passes its generated
        kernels (the fused AdamW update) here."""
        self.graph = graph
        self.donate = donate
        self.device = None if device is None else torch.device(device)
        self._on_device = self.device is not None and self.device.type != "cpu"
        slot: dict[Value, int] = {}
        for v in graph.inputs:
            slot[v] = len(slot)
        last_use: dict[Value, int] = {}
        nodes = list(graph.nodes)
        for i, n in enumerate(nodes):
            for v in n.operands:
                last_use[v] = i
            for r in n.results:
                slot[r] = len(slot)
        outputs = set(graph.outputs)
        self._steps: list = _Steps(self)
        self._run: Any = None  # the generated straight-line function of the steps (made on first call)
        pending: set[int] = set()  # slots an asynchronous collective fills
        # Nodes without operands or effects (constants, full, iota) give the same tensor on
        # every call: they are computed here once, unless they are outputs (a caller may
        # write into what it gets back) or carried dtypes.
        self.hoisted: list[tuple[int, Any]] = []
        for i, n in enumerate(nodes):
            opdef = OPS[n.op]
            if (not n.operands and len(n.results) == 1 and not opdef.effects_of(n.attrs)
                    and n.results[0] not in outputs and n.results[0].type.dtype.name not in CARRIER_NAMES):
                with self._device_context():
                    t = opdef.torch([], n.attrs)
                if self._on_device and t.device != self.device:
                    t = t.to(self.device)
                want = carrier_dtype(n.results[0].type.dtype)
                self.hoisted.append((slot[n.results[0]], t if t.dtype is want else t.to(want)))
                continue
            frees = tuple(slot[v] for v in dict.fromkeys(n.operands) if last_use[v] == i and v not in outputs)
            dtypes = tuple(carrier_dtype(r.type.dtype) for r in n.results)
            fn = opdef.torch
            inplace = False
            if donate and opdef.torch_inplace is not None and _may_update_in_place(graph, n, opdef, i, last_use):
                fn = opdef.torch_inplace
                inplace = True
            carried = any(v.type.dtype.name in CARRIER_NAMES for v in (*n.operands, *n.results))
            if opdef.torch_prepare is not None and not carried:
                fn = opdef.torch_prepare(n)
            elif kernels is not None and n.op in kernels and not carried:
                made = kernels[n.op](n, inplace)
                if made is not None:
                    fn = made
            if carried:
                fn = _carried_step(n, opdef)
            waits = tuple(s for s in dict.fromkeys(slot[v] for v in n.operands) if s in pending)
            pending.difference_update(waits)
            started = async_form(opdef) if overlap and not carried else None
            if started is not None and len(n.results) == 1:
                fn = started
                pending.add(slot[n.results[0]])
            elif started is not None and not n.results:
                # A result-less asynchronous op (a send): started here, waited for at the end.
                fn = started
            self.steps.append((fn, tuple(slot[v] for v in n.operands), n.attrs,
                               tuple(slot[r] for r in n.results), dtypes, frees, waits, n))
        self.num_slots = len(slot)
        self._input_dtypes = [None if v.type.dtype.name in CARRIER_NAMES else to_torch_dtype(v.type.dtype)
                              for v in graph.inputs]
        self.input_slots = [(v, slot[v]) for v in graph.inputs]
        self.output_slots = [slot[v] for v in graph.outputs]
        self.output_converters = [(slot[v], v.type.dtype if v.type.dtype.name in CARRIER_NAMES else None)
                                  for v in graph.outputs]
        self.pending_outputs = tuple(s for s in dict.fromkeys(self.output_slots) if s in pending)
        self._bind_plan = _bind_plan(graph, self._input_dtypes, self._on_device)
        self._bind = None if self._bind_plan is None else bind_function(self._bind_plan)
        # [n]: n grows at every call where a param may differ from the previous call's (another
        # tensor, version or address, or bound by the converting path): while it stays, every
        # param is the tensor of the previous call, unchanged (codegen/step_chain.py reads it)
        self.params_epoch: list[int] = [0] if self._bind is None else self._bind.epoch
        self.param_slots = frozenset(slot[v] for v in graph.inputs if v.role != "input")
        # the data inputs (not params): no step chain reads them (codegen/step_chain.chain_steps)
        self.data_slots = frozenset(slot[v] for v in graph.inputs if v.role == "input")

    @property
    def steps(self) -> list:
        """The steps ``(fn, operand slots, attrs, result slots, dtypes, frees, waits, node)`` in
        the order they run. Replacing one (``steps[i] = ...``) or all of them (``steps = [...]``)
        makes the generated function again on the next call."""
        return self._steps

    @steps.setter
    def steps(self, value: list) -> None:
        new = _Steps(self)
        for v in value:
            new.append(v)
        self._steps = new
        self._run = None

    def _device_context(self):
        """Factory calls inside make their tensors on this program's device."""
        return self.device if self._on_device else contextlib.nullcontext()

    def __call__(self, inputs: Sequence[Any] | Mapping[str, Any] | None = None,
                 weights: Mapping[str, Any] | None = None) -> list:
        env: list = [None] * self.num_slots
        for s, t in self.hoisted:
            env[s] = t
        bind = self._bind
        if bind is None or not bind(env, inputs, weights):
            self.params_epoch[0] += 1
            self._bind_converting(env, inputs, weights)
        inflight: list = []  # result-less asynchronous ops (sends) still in flight
        run = self._run
        if run is None:
            run = self._run = _generate(self)
        if not self._on_device and torch.is_inference_mode_enabled():
            # Already under inference mode (a torch.compile graph called for inference): entering
            # it again would change nothing, and costs a context manager a call.
            self._execute(run, env, inflight)
        else:
            with torch.inference_mode(), self._device_context():
                self._execute(run, env, inflight)
        return [env[i] if dt is None else from_carrier(env[i], dt) for i, dt in self.output_converters]

    def _bind_converting(self, env: list, inputs: Any, weights: Mapping[str, Any] | None) -> None:
        """Bind every input into ``env``, checking each value and converting what is not yet a
        tensor of the input's dtype and shape (on the program's device)."""
        tensor = torch.Tensor
        device = self.device if self._on_device else None
        for v, a in bind_inputs(self.graph, inputs, weights):
            dt = v.type.dtype
            want = self._input_dtypes[v.index]
            if type(a) is tensor and a.dtype is want and a.shape == v.type.shape and \
                    (device is None or a.device == device):
                # The common case of a loop feeding tensors back: nothing to convert or check.
                env[v.index] = a
                continue
            if dt.name in CARRIER_NAMES:
                t = _to_carrier_checked(v, a)
            elif isinstance(a, tensor):
                t = a
                check_array(v, tuple(t.shape), _dtype_name(t))
            else:
                # Checked as an array first: torch cannot convert every dtype NumPy has.
                arr = host_array(v, a)
                check_array(v, arr.shape, numpy_dtype_name(arr))
                t = to_tensor(arr)
            env[v.index] = t if device is None else t.to(device)

    def _execute(self, run: Any, env: list, inflight: list) -> None:
        """Run the generated function over ``env``; an error names the node whose step raised."""
        try:
            run(env, inflight)
        except Exception as e:
            node = _failed_node(self, e)
            if node is None:
                raise
            err = node_error(node, e, "torch implementation")
            if err is e:
                raise
            raise err from e
        for i in self.pending_outputs:
            if type(env[i]) is Pending:
                env[i] = env[i].result()
        for p in inflight:
            p.result()


_MISSING = object()


def _bind_plan(graph: Graph, dtypes: list, on_device: bool) -> tuple[list, list] | None:
    """What ``_bind_ready`` checks: ``(slot, dtype, shape)`` of each ``input``-role value in
    order, and ``(slot, dtype, shape, name)`` of each other input (a param or state, looked up
    by name in the weights); None where no call can take that path (a carried dtype, a
    symbolic dimension, a device, two inputs of one name)."""
    names = [input_name(v) for v in graph.inputs]
    if on_device or len(set(names)) != len(names) or any(d is None for d in dtypes):
        return None
    data, params = [], []
    for v, name, want in zip(graph.inputs, names, dtypes):
        shape = tuple(v.type.shape)
        if not all(type(d) is int for d in shape):
            return None
        if v.role == "input":
            data.append((v.index, want, shape))
        else:
            params.append((v.index, want, shape, name))
    return data, params


def _bind_ready(plan: tuple[list, list] | None, env: list, inputs: Any, weights: Any) -> bool:
    """Bind the inputs into ``env`` where every value is already a torch tensor of its input's
    dtype and shape, given as a list or tuple (the ``input``-role values in order) and a dict
    of weights (none for a graph without params): the values of every call of a compiled
    graph. False where any is not (the caller then binds them all through ``bind_inputs``,
    which checks, converts and explains)."""
    if plan is None or (type(inputs) is not list and type(inputs) is not tuple):
        return False
    data, params = plan
    if len(inputs) != len(data):
        return False
    if weights is None:
        if params:
            return False
        weights = {}
    elif type(weights) is not dict:
        return False
    tensor = torch.Tensor
    for (s, want, shape), a in zip(data, inputs):
        if not isinstance(a, tensor) or a.dtype is not want or a.shape != shape:
            return False
        env[s] = a
    for s, want, shape, name in params:
        a = weights.get(name, _MISSING)
        if not isinstance(a, tensor) or a.dtype is not want or a.shape != shape:
            return False
        env[s] = a
    return True


def _dead_ref() -> None:
    """A weak reference to nothing: what ``bind_function``'s params start from."""
    return None


def bind_function(plan: tuple[list, list]) -> Any:
    """``_bind_ready`` for one plan as straight-line code, ``bind(env, inputs, weights) ->
    bool``: each input's slot, dtype, shape and name are constants of the function (no loop,
    no tuple unpacking), the same checks in the same order. A param that is the very tensor the
    previous call checked (a weak reference), at the same version (``resize_`` and ``set_``
    bump it, as any in-place write) and at the same address (``.data =`` swaps the storage and
    shape without a new version), is bound without its checks again: reading a tensor's
    shape is about half of its binding, and a compiled model's weights are the same tensors at
    every call (ResNet's 29 params: 15 -> 9 us a call on a loaded machine)."""
    data, params = plan
    ns: dict[str, Any] = {"T": torch.Tensor, "M": _MISSING, "R": [_dead_ref] * len(params),
                          "V": [-1] * len(params), "P": [0] * len(params), "ref": weakref.ref, "E": [0]}
    lines = ["def _bind(env, inputs, weights):",
             "    if type(inputs) is not list and type(inputs) is not tuple: return False",
             f"    if len(inputs) != {len(data)}: return False",
             "    if weights is None:",
             f"        {'return False' if params else 'weights = {}'}",
             "    elif type(weights) is not dict: return False"]
    for i, (s, want, shape) in enumerate(data):
        ns[f"D{s}"], ns[f"S{s}"] = want, shape
        lines += [f"    a = inputs[{i}]",
                  f"    if not isinstance(a, T) or a.dtype is not D{s} or a.shape != S{s}: return False",
                  f"    env[{s}] = a"]
    if params:
        lines.append("    get = weights.get")
    for k, (s, want, shape, name) in enumerate(params):
        ns[f"D{s}"], ns[f"S{s}"] = want, shape
        lines += [f"    a = get({name!r}, M)",
                  f"    if R[{k}]() is not a or a._version != V[{k}] or a.data_ptr() != P[{k}]:",
                  "        E[0] += 1",
                  f"        if not isinstance(a, T) or a.dtype is not D{s} or a.shape != S{s}: return False",
                  "        if not a.is_inference():",   # an inference tensor has no version counter
                  f"            R[{k}], V[{k}], P[{k}] = ref(a), a._version, a.data_ptr()",
                  f"    env[{s}] = a"]
    lines.append("    return True")
    exec(compile("\n".join(lines) + "\n", "<partita bind>", "exec"), ns)
    fn = ns["_bind"]
    fn.epoch = ns["E"]   # TorchProgram.params_epoch: bumped wherever a param is not the last call's
    return fn


class _Steps(list):
    """``TorchProgram.steps``: replacing a step (the runtime wraps collectives, codegen binds
    planned buffers) drops the generated function, which is made again on the next call."""

    def __init__(self, owner: "TorchProgram") -> None:
        super().__init__()
        self._owner = owner

    def __setitem__(self, i, v) -> None:
        super().__setitem__(i, v)
        self._owner._run = None

    def append(self, v) -> None:
        super().append(v)
        self._owner._run = None


_GENERATED_FILE = "<partita program>"


class ConstantStep:
    """A step whose one result is the same tensor at every call: a view made once of memory the
    program owns (codegen binds the views of its arena's buffers this way). The generated
    function reads it as a constant: no call, no checks."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, args: list, attrs: dict) -> Any:
        return self.value


def _generate(prog: "TorchProgram"):
    """The program's steps as one straight-line Python function over local variables: no
    interpreter loop, no per-step tuple unpacking or slot list indexing. Its source lines map
    back to steps (``_failed_node``), so an error still names its node."""
    steps = list(prog.steps)
    made = {o for st in steps for o in st[3]}
    used = sorted({a for st in steps for a in (*st[1], *st[6])} | set(prog.output_slots))
    lines = ["def _run(env, inflight):"]
    line_step: dict[int, int] = {}
    for sl in used:
        if sl not in made:
            lines.append(f"    s{sl} = env[{sl}]")
    ns: dict[str, Any] = {"Pending": Pending, "T": torch.Tensor}
    for k, (fn, args, attrs, outs, dtypes, frees, waits, node) in enumerate(steps):
        ns[f"F{k}"], ns[f"A{k}"] = fn, attrs
        for w in waits:
            lines.append(f"    if type(s{w}) is Pending: s{w} = s{w}.result()")
            line_step[len(lines)] = k
        call = f"F{k}([{', '.join(f's{a}' for a in args)}], A{k})"
        shape = _inline_reshape(fn, node, outs)
        if type(fn) is ConstantStep and len(outs) == 1 and not waits:
            ns[f"C{k}"] = fn.value
            lines.append(f"    s{outs[0]} = C{k}")
            line_step[len(lines)] = k
        elif shape is not None:
            # a reshape to a static shape, as a method call in place: no step function, no
            # argument list, no result checks (a reshape keeps its operand's dtype)
            ns[f"S{k}"] = shape
            lines.append(f"    s{outs[0]} = s{args[0]}.reshape(S{k})")
            line_step[len(lines)] = k
        elif not outs:
            lines.append(f"    r = {call}")
            line_step[len(lines)] = k
            lines.append("    if type(r) is Pending: inflight.append(r)")
        elif len(outs) == 1:
            o = outs[0]
            ns[f"D{k}"] = dtypes[0]
            lines.append(f"    s{o} = {call}")
            line_step[len(lines)] = k
            if getattr(fn, "exact_result", False) is not True:
                lines += result_checks(f"s{o}", f"D{k}")
        else:
            lines.append(f"    r = {call}")
            line_step[len(lines)] = k
            for j, o in enumerate(outs):
                ns[f"D{k}_{j}"] = dtypes[j]
                lines.append(f"    s{o} = r[{j}] if r[{j}].dtype is D{k}_{j} else r[{j}].to(D{k}_{j})")
        for f in frees:
            lines.append(f"    s{f} = None")
    for sl in dict.fromkeys(prog.output_slots):
        lines.append(f"    env[{sl}] = s{sl}")
    lines.append("    return None")
    code = compile("\n".join(lines) + "\n", _GENERATED_FILE, "exec")
    exec(code, ns)
    fn = ns["_run"]
    fn._line_step = line_step
    fn._source = "\n".join(lines)
    return fn


def result_checks(v: str, d: str) -> list[str]:
    """The generated lines that make a step's result ``v`` one value of the dtype ``d``: the
    first of a list or tuple, converted where its dtype differs (a Pending is left as it is).
    A plain tensor, the common case, takes one type test and one dtype test. A step function
    whose attribute ``exact_result`` is True (it returns one tensor of the result's dtype)
    gets none of these."""
    return [f"    if type({v}) is not T:",
            f"        if type({v}) in (list, tuple): {v} = {v}[0]",
            f"        if type({v}) is not Pending and {v}.dtype is not {d}: {v} = {v}.to({d})",
            f"    elif {v}.dtype is not {d}: {v} = {v}.to({d})"]


def _inline_reshape(fn: Any, node: Node, outs: Sequence[int]) -> tuple[int, ...] | None:
    """The static target shape of a ``reshape`` step that runs the op's own torch function
    (not a replacement), or None."""
    if node.op != "reshape" or len(outs) != 1 or len(node.operands) != 1:
        return None
    opdef = OPS.get("reshape")
    if opdef is None or fn is not opdef.torch:
        return None
    shape = node.results[0].type.shape
    return tuple(shape) if all(isinstance(d, int) for d in shape) else None


def _failed_node(prog: "TorchProgram", e: BaseException) -> Node | None:
    """The node whose step raised ``e`` inside the generated function."""
    tb = e.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _GENERATED_FILE:
            line = tb.tb_lineno
        tb = tb.tb_next
    run = prog._run
    if line is None or run is None:
        return None
    k = run._line_step.get(line)
    return None if k is None else prog.steps[k][7]


def _may_update_in_place(graph: Graph, node: Node, opdef: OpDef, i: int, last_use: dict[Value, int]) -> bool:
    """Every (result, operand) pair of ``opdef.inplace`` is a graph output aliasing that
    operand, an input no later node reads and that is not returned itself."""
    if not opdef.inplace:
        return False
    alias_of = {id(v): a for v, a in zip(graph.outputs, graph.output_aliases) if a is not None}
    outputs = set(graph.outputs)
    for r, o in opdef.inplace:
        if r >= len(node.results) or o >= len(node.operands):
            return False
        v = node.operands[o]
        if alias_of.get(id(node.results[r])) is not v or last_use.get(v) != i or v in outputs:
            return False
        if sum(1 for u in node.operands if u is v) != 1:
            return False
    return True


def to_tensor(a: Any):
    """A torch tensor of a NumPy array (bf16, u16/u32/u64 and float8 included) or a tensor.

    The 4- and 2-bit storage types, which torch lacks, come back as f32 holding the values.
    """
    if isinstance(a, torch.Tensor):
        return a
    arr = np.asarray(a)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.uint16).copy()).view(torch.bfloat16)
    if arr.dtype.kind == "V" or arr.dtype.name.startswith("float8"):
        from ..ir.dtypes import from_numpy

        dt = from_numpy(arr.dtype)
        if dt.name in ("f4e2m1", "i4", "u4", "i2", "u2"):
            return torch.from_numpy(arr.astype(np.float32))
        return torch.from_numpy(arr.view(np.uint8).copy()).view(to_torch_dtype(dt))
    # np.ascontiguousarray turns a 0-d array into shape (1,); np.require keeps the rank.
    # A read-only array (a constant's payload, a memory-mapped weight) is copied: torch
    # tensors are always writable, and sharing would let a later in-place op change it.
    return torch.from_numpy(np.require(arr, requirements=("C", "W")))


# --- carriers: dtypes torch holds in a wider type ---------------------------------------

_NATIVE_UNSIGNED = {"u16": "uint16", "u32": "uint32", "u64": "uint64"}
_MASKS = {"u16": 0xFFFF, "u32": 0xFFFFFFFF}
_SIGN_BIT = -(2 ** 63)

# How a node that touches u64 runs on its int64 carrier (ops not listed are refused unless
# they only move data or all their results are floats). "wrap": two's complement arithmetic
# gives the exact unsigned result. "ordered": compare after flipping the sign bit.
_U64_RULES = {"add": "wrap", "sub": "wrap", "mul": "wrap", "neg": "wrap", "sum": "wrap",
              "equal": "wrap", "not_equal": "wrap", "where": "wrap", "logical_and": "wrap",
              "logical_or": "wrap", "logical_not": "wrap",
              "less": "ordered", "less_equal": "ordered", "greater": "ordered", "greater_equal": "ordered",
              "maximum": "ordered", "minimum": "ordered",
              # bits as they are; integers round to themselves and are never NaN or infinite
              "bitwise_and": "wrap", "bitwise_or": "wrap", "bitwise_xor": "wrap", "bitwise_not": "wrap",
              "bitwise_left_shift": "wrap", "floor": "wrap", "ceil": "wrap", "round": "wrap", "trunc": "wrap",
              "isnan": "wrap", "isinf": "wrap",
              # unsigned division and logical shifts have no int64 kernel: the op's NumPy
              # reference computes them on the host, in uint64
              "remainder": "host", "fmod": "host", "int_div": "host", "bitwise_right_shift": "host",
              "topk": "ordered", "sort": "ordered"}


def to_carrier(t, dt: DType):
    """The executor's carrier tensor for tensor ``t`` holding values of partita dtype ``dt``
    in torch's own dtype (torch.uint16, torch.float8_e4m3fn, ...; f32 for 4/2-bit types)."""
    if dt.name == "u64":
        return t.view(torch.int64) if t.dtype == torch.uint64 else t.to(torch.int64)
    return t.to(carrier_dtype(dt))


def from_carrier(t, dt: DType):
    """A carrier back in partita dtype ``dt``: a torch.uint16/32/64 tensor for the unsigned
    types, a NumPy array of the ml_dtypes type for storage types."""
    if dt.storage:
        # The carrier holds values of dt exactly, so a plain conversion is exact (a saturating
        # cast would turn an f8e5m2 infinity into its max).
        return t.detach().cpu().numpy().astype(dt.np)
    if dt.name == "u64":
        return t.view(torch.uint64)
    return t.to(getattr(torch, _NATIVE_UNSIGNED[dt.name]))


def _to_carrier_checked(v: Value, a: Any):
    """Input ``a`` for graph input ``v`` (of a carried dtype), checked, as its carrier."""
    dt = v.type.dtype
    if isinstance(a, torch.Tensor):  # torch's own dtype: torch.uint32, torch.float8_e5m2, ...
        check_array(v, tuple(a.shape), _dtype_name(a))
        return to_carrier(a, dt)
    arr = host_array(v, a)
    check_array(v, arr.shape, numpy_dtype_name(arr))
    if dt.storage:
        return torch.from_numpy(arr.astype(np.float32))
    if dt.name == "u64":
        return torch.from_numpy(arr.view(np.int64).copy())
    return torch.from_numpy(arr.astype(np.dtype(CARRIER_NAMES[dt.name])))


def _carried_step(node: Node, opdef: OpDef):
    """The step function for a node touching a carried dtype (see the module doc)."""
    ins = [v.type.dtype for v in node.operands]
    outs = [r.type.dtype for r in node.results]
    fn = opdef.torch
    where = f" at {node.text_loc or node.loc}" if (node.text_loc or node.loc) else ""
    if not ins and not opdef.effects_of(node.attrs):
        # Constants and fills: the reference computes the payload once, converted to carriers
        # (torch cannot build most of these dtypes itself).
        from .numpy_ref import run_node_reference

        cached = [to_carrier(to_tensor(r), d) for r, d in zip(run_node_reference(node, []), outs)]
        if len(cached) == 1:
            return lambda args, attrs: cached[0].clone()
        return lambda args, attrs: [c.clone() for c in cached]
    if node.op == "cast":
        return _carried_cast(ins[0], outs[0])
    names = {d.name for d in (*ins, *outs)}
    masks = [_MASKS.get(d.name) for d in outs]

    def finish(res):
        # u16/u32 results are reduced modulo 2**bits: the wider carrier computed them exactly.
        if len(outs) == 1:
            res = res[0] if type(res) in (list, tuple) else res
            return res if masks[0] is None else res.to(carrier_dtype(outs[0])) & masks[0]
        return [r if m is None else r.to(carrier_dtype(d)) & m for r, m, d in zip(res, masks, outs)]

    if "u64" not in names:
        return lambda args, attrs: finish(fn(args, attrs))
    u64_in = [d.name == "u64" for d in ins]
    rule = _U64_RULES.get(node.op)
    to_float = None
    if opdef.elementwise:
        try:
            promoted = promote_all(ins)
        except TypeRuleError:
            promoted = None
        if promoted is not None and promoted.is_float:
            to_float = promoted
    if to_float is None and rule is None and all(d.is_float for d in outs):
        to_float = outs[0]
    if opdef.cost is movement_cost:
        rule = "wrap"
    elif to_float is not None:
        # u64 promoted to a float: convert the operands to it first (torch's own uint64 -> float
        # conversion rounds once), as the promotion says.
        to = carrier_dtype(to_float)
        return lambda args, attrs: fn([a.view(torch.uint64).to(to) if u else a for a, u in zip(args, u64_in)], attrs)
    if rule == "wrap":
        return lambda args, attrs: finish(fn(args, attrs))
    if rule == "ordered":
        flip_out = [d.name == "u64" for d in outs]

        def ordered(args, attrs):
            res = fn([a ^ _SIGN_BIT if u else a for a, u in zip(args, u64_in)], attrs)
            if type(res) in (list, tuple):  # topk, sort: the values flip back, the indices not
                return [r ^ _SIGN_BIT if f else r for r, f in zip(res, flip_out)]
            return res ^ _SIGN_BIT if flip_out[0] else res
        return ordered
    if rule == "host" and len(outs) == 1:
        def host(args, attrs):
            arrs = [a.cpu().numpy().view(np.uint64) if u else a.cpu().numpy().astype(d.np)
                    for a, u, d in zip(args, u64_in, ins)]
            res = np.asarray(opdef.reference(arrs, attrs)).astype(outs[0].np)
            return to_carrier(to_tensor(res), outs[0]).to(args[0].device)
        return host
    raise ExecutionError(f"{node.op}{where}: the torch executor cannot compute {node.op} on u64 exactly "
                         "(torch has no CPU kernels for unsigned 64-bit integers and partita holds them in "
                         "int64); run this graph with backend=\"numpy\", or cast to i64 or f64 first")


def _carried_cast(src: DType, dst: DType):
    """A cast where the source or the target is carried."""
    if dst.storage:
        # Rounding into float8 (saturation, NaN rules) and the 4/2-bit types follows
        # cast_array exactly; the values travel through the host once.
        def to_storage(args, attrs):
            x = args[0]
            host = from_carrier(x, src) if src.name in CARRIER_NAMES else x
            arr = to_numpy(host) if not isinstance(host, np.ndarray) else host
            # np.asarray: a rank-0 cast comes back from NumPy as a scalar, not an array.
            y = np.asarray(cast_array(arr, dst, attrs["saturate"], attrs["round_mode"]))
            return torch.from_numpy(y.astype(np.float32)).to(x.device)
        return to_storage
    if dst.is_bool:
        return lambda args, attrs: args[0] != 0
    if src.storage:
        src_native = None
    else:
        src_native = _NATIVE_UNSIGNED.get(src.name)
    # A 4- or 2-bit integer travels as f32 holding its value; it is cast as the integer it is.
    int_carried_as_float = src.storage and src.is_int
    to = getattr(torch, _NATIVE_UNSIGNED[dst.name]) if dst.name in _NATIVE_UNSIGNED else to_torch_dtype(dst)

    def cast(args, attrs):
        x = args[0]
        if src_native == "uint64":
            x = x.view(torch.uint64)
        elif src_native is not None:
            x = x.to(getattr(torch, src_native))
        elif int_carried_as_float:
            x = x.to(torch.int64)
        if x.is_floating_point() and dst.is_int:
            # Rounded and saturated as cast_array does; u64 comes back as its int64 carrier.
            return float_to_int_torch(x, dst).to(carrier_dtype(dst))
        y = x.to(to)
        return to_carrier(y, dst) if dst.name in CARRIER_NAMES else y
    return cast


def _dtype_name(t) -> str:
    from ..ops._lazy import from_torch_dtype

    try:
        return from_torch_dtype(t.dtype).name
    except KeyError:
        return str(t.dtype)


def run(graph: Graph, inputs: Sequence[Any] | Mapping[str, Any] | None = None,
        weights: Mapping[str, Any] | None = None) -> list:
    """Run ``graph`` once with torch; returns torch tensors."""
    return TorchProgram(graph)(inputs, weights)
