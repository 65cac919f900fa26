"""Consecutive generated-kernel steps run from one native call (docs/codegen.md, "Step chains").

A small CNN's program is a row of convolutions whose kernels take a few microseconds each, and
each step pays about 1.5 us of Python around its kernel: the generated function's call, the
library step's checks that its packed weight is still good, the prepared kernel's checks that
its parameter block still points at the call's tensors, and the ctypes call. Once a program is
in its steady state (every weight packed, every kernel chosen and bound to its buffers in the
arena), those checks give the same answer at every call, and the kernels' entries with their
parameter blocks are a fixed list.

``chain_steps`` replaces each run of such steps (two or more in a row, each step's function
offering ``native_entry``) by a ``ChainStep`` at the run's first position and constant steps
(the result buffers in the arena) at the others. At a call the chain checks, once for the whole
run, what the steps checked one by one: one thread, the same tensors from outside the run as at
its last call (by identity; a weak reference to each drops the chain's state when one dies), at
the same addresses, and the packed weights' sources at the same versions. Then one ctypes call
of ``pt_step_chain`` calls each kernel's whole-range entry on its parameter block in order.
Where any check fails, the chain runs its steps' own functions as the program did (they check
and re-bind what changed), copies any result that did not land in its buffer there, and arms
itself again where every step is native once more.

``PARTITA_STEP_CHAIN=0`` leaves the program's steps as they are.
"""
from __future__ import annotations

import ctypes
import os
import threading
import weakref
from operator import attrgetter
from typing import Any, Callable

import torch

from ..backend.torch_exec import ConstantStep

ENABLED = os.environ.get("PARTITA_STEP_CHAIN", "1") != "0"

# how many calls a program waits for its native steps to settle before it stops looking
MAX_TRIES = 8

_ENTRY_NAME = "pt_step_chain"
_LOCK = threading.Lock()
_ENTRY: list = []   # [the compiled loop, or None where it did not compile]


def chain_ir(name: str = _ENTRY_NAME) -> str:
    """``name(ptr table)``: table = [n, entry 0, params 0, entry 1, params 1, ...] (i64 each);
    calls ``entry i(params i)`` for i < n in order (n >= 1)."""
    return "\n".join([
        f"define void @{name}(ptr %t) nounwind {{",
        "entry:",
        "  %n = load i64, ptr %t, align 8",
        "  br label %loop",
        "loop:",
        "  %i = phi i64 [ 0, %entry ], [ %i.n, %loop ]",
        "  %o = shl i64 %i, 1",
        "  %o1 = add i64 %o, 1",
        "  %o2 = add i64 %o, 2",
        "  %fp = getelementptr inbounds i64, ptr %t, i64 %o1",
        "  %ap = getelementptr inbounds i64, ptr %t, i64 %o2",
        "  %fv = load i64, ptr %fp, align 8",
        "  %av = load i64, ptr %ap, align 8",
        "  %f = inttoptr i64 %fv to ptr",
        "  %a = inttoptr i64 %av to ptr",
        "  call void %f(ptr %a)",
        "  %i.n = add i64 %i, 1",
        "  %c = icmp ult i64 %i.n, %n",
        "  br i1 %c, label %loop, label %exit",
        "exit:",
        "  ret void",
        "}",
    ]) + "\n"


def chain_entry() -> Any:
    """The compiled ``pt_step_chain(table)`` (once a process), or None where it does not compile."""
    with _LOCK:
        if not _ENTRY:
            try:
                from .jit import jit

                _ENTRY.append(jit().kernel(_ENTRY_NAME, chain_ir(), 0, argtypes=[ctypes.c_void_p]).fn)
            except Exception:   # CodegenError, llvmlite missing: the steps run as they are
                _ENTRY.append(None)
        return _ENTRY[0]


def function_address(fn: Any) -> int:
    """The address of a ctypes function."""
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


class _Member:
    """One step of a chain: its function, where its operands come from (an index into the
    chain's outside operands, or a fixed tensor made inside the run), its attrs and its
    result buffer."""

    __slots__ = ("fn", "sources", "attrs", "out", "node", "index")

    def __init__(self, fn: Any, sources: list, attrs: dict, out: Any, node: Any, index: int) -> None:
        self.fn, self.sources, self.attrs, self.out, self.node = fn, sources, attrs, out, node
        self.index = index   # its position in the program's steps


_version = attrgetter("_version")
_data_ptr = torch.Tensor.data_ptr


class ChainStep:
    """The step that runs a chain's members (see the module doc). Its operands are the tensors
    the run reads from before it (the ``outside`` slots, in order); its result is the first
    member's result buffer, the others' are constant steps of theirs.

    The guard has two forms. Where the program's ``params_epoch`` is what it was when the chain
    last checked everything, every param among the operands is the tensor of that check,
    unchanged (the program's binding compared each with the previous call's: object, version,
    address): only the other operands (activations, the program's input) are checked, by
    identity and address. Otherwise all of them, and each weight's version."""

    exact_result = True   # the first member's buffer: one f32 tensor of the node's dtype

    def __init__(self, members: list[_Member], n_args: int, weight_args: list[int], param_args: list[int],
                 epoch: list[int], stats: dict[str, int], original: dict[int, tuple]) -> None:
        from .library import count_calls

        self.members = members
        self.original = original         # step index -> the step it replaced (``unchain``)
        # the step indices of the members not native at the last arming (``_arm``)
        self.failed: list[int] = []
        self.weight_args = weight_args   # indices of the outside operands that packed weights come from
        self.other_args = [i for i in range(n_args) if i not in set(param_args)]   # activations, inputs
        self.epoch = epoch               # the program's params_epoch
        self.checked_epoch = -1          # its value when every operand was last found as at arming
        self.stats = list(stats.items())  # library counters the members' steps would have bumped
        self.count_calls = count_calls
        self.armed = False
        self.ids: list[int] = []
        self.ptrs: list[int] = []
        self.other_ids: list[int] = []
        self.other_ptrs: list[int] = []
        self.versions: list[int] = []
        self.refs: list = []
        self.table: Any = None
        self.table_addr = 0
        self.entry = chain_entry()
        self.native_calls = 0   # calls run by the one native call (tests read it)
        self.moved: set[int] = set()   # operands found another tensor or address than at the last arming

    def _disarm(self, ref: Any = None) -> None:
        if ref is not None:   # an operand died: one a step before the run makes anew at every call
            self.moved |= {i for i, r in enumerate(self.refs) if r is ref}
        self.armed = False
        self.refs = []

    def __call__(self, args: list, attrs: dict) -> Any:
        if self.armed and torch.get_num_threads() == 1:
            if self.epoch[0] == self.checked_epoch:
                others = [args[i] for i in self.other_args]
                ok = list(map(id, others)) == self.other_ids and list(map(_data_ptr, others)) == self.other_ptrs
            else:
                ok = list(map(id, args)) == self.ids and list(map(_data_ptr, args)) == self.ptrs \
                    and [args[i]._version for i in self.weight_args] == self.versions
                if ok:
                    self.checked_epoch = self.epoch[0]
            if ok:
                self.entry(self.table_addr)
                self.native_calls += 1
                if self.stats:
                    self.count_calls(self.stats)
                return self.members[0].out
        return self._stepwise(args)

    def _stepwise(self, args: list) -> Any:
        """Each member's own step, as the program ran them; then arm where every one is native."""
        if self.armed and len(args) == len(self.ids):   # what moved since the arming (``settle`` reads it)
            self.moved |= {i for i, a in enumerate(args) if id(a) != self.ids[i] or a.data_ptr() != self.ptrs[i]}
        self._disarm()
        for m in self.members:
            a = [args[s] if type(s) is int else s.value for s in m.sources]
            r = m.fn(a, m.attrs)
            if type(m.out) is tuple:   # a step of several results
                for t, got in zip(m.out, r):
                    if got is not t:
                        t.copy_(got)
                continue
            if type(r) in (list, tuple):
                r = r[0]
            if r is not m.out:
                m.out.copy_(r)
        self._arm(args)
        return self.members[0].out

    def _arm(self, args: list) -> None:
        if self.entry is None:
            return
        entries = []
        failed = []
        for m in self.members:
            a = [args[s] if type(s) is int else s.value for s in m.sources]
            e = m.fn.native_entry(a)
            if e is None:
                failed.append(m.index)
                if packed_operands(m.fn):
                    # a packed weight perhaps not packed again yet: the members after it may
                    # be the same, and wait; so the first such one is split out at a time
                    break
                continue   # a step without packed weights refuses for good (an operand's strides)
            entries.extend(e)
        self.failed = failed
        if failed:
            return
        table = (ctypes.c_int64 * (1 + len(entries)))(len(self.members), *entries)
        try:
            self.refs = [weakref.ref(a, self._disarm) for a in args]
        except TypeError:   # an operand that takes no weak reference: never armed
            return
        self.table, self.table_addr = table, ctypes.addressof(table)
        self.ids = list(map(id, args))
        self.ptrs = list(map(_data_ptr, args))
        others = [args[i] for i in self.other_args]
        self.other_ids = list(map(id, others))
        self.other_ptrs = list(map(_data_ptr, others))
        self.versions = [args[i]._version for i in self.weight_args]
        self.checked_epoch = self.epoch[0]
        self.armed = True


class _Fixed:
    """A member's operand made inside the run: a tensor that is the same at every call."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def native_steps(prog: Any) -> list[int]:
    """The indices of the program's steps that are native now: one result, no collective to
    wait for, and a step function whose ``native_entry()`` (with its last call's tensors) gives
    a kernel entry."""
    found = []
    for i, st in enumerate(prog.steps):
        fn = st[0]
        ask: Callable | None = getattr(fn, "native_entry", None)
        if ask is not None and len(st[3]) == len(native_outs(fn)) and not st[6] and ask(None) is not None:
            found.append(i)
    return found


def packed_operands(fn: Any) -> tuple:
    """The positions of a native step's operands that a packed copy is made of (operand 1, the
    weight, unless the step says otherwise: ``offer_native``)."""
    return getattr(fn, "native_packed", (1,))


def native_outs(fn: Any) -> tuple:
    """The buffers a native step writes its results into, in the order of its results
    (``native_outs``; ``native_out`` alone for a step of one result)."""
    outs = getattr(fn, "native_outs", None)
    return tuple(outs) if outs is not None else (fn.native_out,)


def _constant_values(st: tuple) -> tuple | None:
    """A constant step's value for each of its results (a split's pieces each, views made once),
    or None where they do not match up. A run reads them as fixed tensors: a step inside the
    run that binds a slot a member reads would bind it too late (the chain runs at the run's
    first position), so a constant step whose values are not known breaks a run."""
    value, outs = st[0].value, st[3]
    if len(outs) == 1 and not isinstance(value, (list, tuple)):
        return (value,)
    if isinstance(value, (list, tuple)) and len(value) == len(outs):
        return tuple(value)
    return None


def runs_of(prog: Any, native: list[int]) -> list[list[int]]:
    """The runs of two or more ``native`` steps in a row (constant steps between them allowed)."""
    native_set = set(native)
    runs: list[list[int]] = []
    cur: list[int] = []
    for i, st in enumerate(prog.steps):
        if i in native_set:
            cur.append(i)
        elif type(st[0]) is ConstantStep and cur and _constant_values(st) is not None:
            continue   # a view made once between two kernels: read as the constant it is
        else:
            if len(cur) >= 2:
                runs.append(cur)
            cur = []
    if len(cur) >= 2:
        runs.append(cur)
    return runs


def chain_steps(prog: Any, native: list[int]) -> list[ChainStep]:
    """Replace each run of ``runs_of(prog, native)`` by a ``ChainStep`` and constant steps.
    A step reading one of the program's inputs stays out: a caller passing a new input tensor
    at every call would find the chain's operand moved at each, and each such call would run
    the steps one by one and arm the chain again, slower than no chain."""
    if not ENABLED or chain_entry() is None:
        return []
    inputs: frozenset[int] = getattr(prog, "data_slots", frozenset())
    native = [i for i in native if not inputs.intersection(prog.steps[i][1])]
    return [_chain_run(prog, run) for run in runs_of(prog, native)]


def unchain(prog: Any, chain: ChainStep) -> None:
    """Put back the steps ``chain`` replaced."""
    for i, st in chain.original.items():
        prog.steps[i] = st


def settle(prog: Any, chains: list[ChainStep]) -> tuple[list[ChainStep], bool]:
    """After a call: each chain that did not arm is put back and its steps on either side of
    the member that was not native are chained again; each chain that armed but found an
    operand moved at its next call (a tensor a step before it makes anew at every call) is put
    back and its steps that do not read such an operand chained again. Returns the chains and
    whether every one has run as its native call."""
    out: list[ChainStep] = []
    for c in chains:
        if c.armed and (c.native_calls or not c.moved):
            out.append(c)
            continue
        unchain(prog, c)
        if c.moved:   # an operand found another tensor, or that died after the call
            drop = {m.index for m in c.members if any(type(s) is int and s in c.moved for s in m.sources)}
        elif c.failed:
            drop = set(c.failed)
        else:   # not armed for another reason (threads, no weak reference)
            continue
        rest = [i for i in c.original if i not in drop and getattr(prog.steps[i][0], "native_entry", None)]
        out += [_chain_run(prog, run) for run in runs_of(prog, rest)]
    return out, all(c.native_calls for c in out)


def _chain_run(prog: Any, run: list[int]) -> ChainStep:
    from .library import conv_step_stats

    steps = prog.steps
    original = {i: steps[i] for i in range(run[0], run[-1] + 1) if type(steps[i][0]) is not ConstantStep}
    fixed: dict[int, _Fixed] = {}   # slot -> a tensor made inside the run
    outside: list[int] = []         # slots read from before the run, in order
    members = []
    weight_args: list[int] = []
    stats: dict[str, int] = {}
    for i in range(run[0], run[-1] + 1):
        fn, ops, attrs, outs, _dt, _fr, _w, node = steps[i]
        if type(fn) is ConstantStep:
            for o, t in zip(outs, _constant_values(steps[i]) or ()):
                fixed[o] = _Fixed(t)
            continue
        written = native_outs(fn)
        out = written[0] if len(written) == 1 else written   # what the step returns
        packed = packed_operands(fn)
        sources: list = []
        for j, s in enumerate(ops):
            if s in fixed:
                sources.append(fixed[s])
                continue
            if s not in outside:
                outside.append(s)
            k = outside.index(s)
            sources.append(k)
            if j in packed and k not in weight_args:   # the weight a packed copy is made from
                weight_args.append(k)
        members.append(_Member(fn, sources, attrs, out, node, i))
        for o, t in zip(outs, written):
            fixed[o] = _Fixed(t)
        for key, v in conv_step_stats(fn).items():
            stats[key] = stats.get(key, 0) + v
    # constant steps between the members stay where they are (read later too, perhaps); the
    # members after the first become their result buffers, their operands read by the chain
    first = steps[run[0]]
    param_args = [k for k, s in enumerate(outside) if s in prog.param_slots]
    chain = ChainStep(members, len(outside), weight_args, param_args, prog.params_epoch, stats, original)
    frees = tuple(dict.fromkeys(s for i in run for s in steps[i][5]))
    for i in run[1:]:
        st = steps[i]
        written = native_outs(st[0])
        steps[i] = (ConstantStep(written[0] if len(written) == 1 else written), (), st[2], st[3], st[4], (), (), st[7])
    steps[run[0]] = (chain, tuple(outside), first[2], first[3], first[4], frees, (), first[7])
    return chain
