"""The op record (``OpDef``) and the one table of ops (``OPS``).

Everything partita knows about an op lives in its record: operands, typed attributes with
defaults, effects, the type rule, the NumPy reference, the torch implementation, the cost.
The rules that later layers write (the vjp rules of autodiff, the sharding rules of parallel)
live in ``RuleTable``s declared once by their layer and keyed by op name; records are frozen
and never changed after registration, and ``op.vjp`` / ``op.sharding`` read the tables.
Passes ask the record or a table; they do not branch on op names. docs/adding-an-op.md lists
every place an op touches.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from math import prod
from typing import Any, Callable, Iterator

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.diagnostics import AttributeError_, TypeRuleError, UnknownOpError, suggest
from ..ir.dtypes import DType, DTYPES, storage_error
from ..ir.types import Location, TensorType


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

# Attribute kinds and the Python values they hold once normalized.
ATTR_KINDS = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "a quoted string",
    "dtype": "a dtype name (f32, i64, ...)",
    "ints": "a list of integers",
    "floats": "a list of numbers",
    "scalar": "a number or true/false",
    "tensor": "a dense tensor literal dense<TYPE, VALUES>",
}


@dataclass(frozen=True, slots=True)
class AttrSpec:
    """A typed attribute of an op. ``default=None`` makes the attribute optional."""

    name: str
    kind: str
    default: Any = REQUIRED
    choices: tuple | None = None

    def _float(self, value: Any, op: str) -> float:
        """``value`` as a float; an integer beyond every float is an error, not an OverflowError."""
        try:
            return float(value)
        except OverflowError:
            raise AttributeError_(f"{op}: attribute '{self.name}' value {value!r} is out of range of a float "
                                  f"(a float holds up to about 1.8e308)") from None

    def normalize(self, value: Any, op: str) -> Any:
        """Coerce ``value`` to this attribute's canonical Python form, or raise."""
        if value is None:
            if self.default is None:
                return None
            raise AttributeError_(f"{op}: attribute '{self.name}' must be {ATTR_KINDS[self.kind]}, got none")
        k = self.kind
        ok = True
        if k == "int":
            ok = _is_int(value)
            value = int(value) if ok else value
        elif k == "float":
            ok = _is_number(value)
            value = self._float(value, op) if ok else value
        elif k == "bool":
            ok = isinstance(value, (bool, np.bool_))
            value = bool(value) if ok else value
        elif k == "str":
            ok = isinstance(value, str)
        elif k == "dtype":
            if isinstance(value, str) and value in DTYPES:
                value = DTYPES[value]
            ok = isinstance(value, DType)
        elif k == "ints":
            if _is_int(value):
                value = (value,)
            ok = isinstance(value, (tuple, list)) and all(_is_int(v) for v in value)
            value = tuple(int(v) for v in value) if ok else value
        elif k == "floats":
            ok = isinstance(value, (tuple, list)) and all(_is_number(v) for v in value)
            value = tuple(self._float(v, op) for v in value) if ok else value
        elif k == "scalar":
            ok = _is_number(value) or isinstance(value, (bool, np.bool_))
            if ok:
                value = value.item() if isinstance(value, np.generic) else value
        elif k == "tensor":
            if isinstance(value, np.ndarray):
                value = DenseAttr(value)
            ok = isinstance(value, DenseAttr)
        if not ok:
            raise AttributeError_(
                f"{op}: attribute '{self.name}' must be {ATTR_KINDS[k]}, got {format_attr_value(value)}"
            )
        if self.choices is not None and value not in self.choices:
            raise AttributeError_(
                f"{op}: attribute '{self.name}' must be one of {', '.join(map(repr, self.choices))}, got {value!r}"
            )
        return value


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def format_attr_value(v: Any, depth: int = 0) -> str:
    """``v`` for an error message, shortened: lists deeper than 8 levels print as ``...``
    (``[[[...]]]``) and only the first 16 items of a list are shown, so any value, however
    deep or long, gives a short message without deep recursion."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return repr(v) if len(v) <= 80 else repr(v[:80]) + "..."
    if isinstance(v, (tuple, list)):
        if depth >= 8:
            return "[...]" if v else "[]"
        items = [format_attr_value(x, depth + 1) for x in v[:16]]
        if len(v) > 16:
            items.append(f"... ({len(v)} items)")
        return "[" + ", ".join(items) + "]"
    if isinstance(v, np.ndarray):
        return f"an array of shape {list(v.shape)}"
    return str(v)


@dataclass(frozen=True, slots=True)
class Cost:
    """Work of one op instance: floating-point operations and bytes moved."""

    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes_read + other.bytes_read,
                    self.bytes_written + other.bytes_written)


TypeRule = Callable[[list[TensorType], dict], "TensorType | list[TensorType]"]


def default_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    """One FLOP per output element; every operand read once, every result written once."""
    return Cost(
        flops=sum(t.numel for t in outs),
        bytes_read=sum(t.nbytes for t in ins),
        bytes_written=sum(t.nbytes for t in outs),
    )


def movement_cost(ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
    """No arithmetic: the op only moves or views data."""
    return Cost(0, sum(t.nbytes for t in ins), sum(t.nbytes for t in outs))


@dataclass(frozen=True, eq=False)
class OpDef:
    """Everything partita knows about one op.

    operands: names in order; a trailing ``?`` marks an optional operand (only trailing ones
      may be omitted); a leading ``*`` marks a variadic operand (one or more values).
    infer: the type rule ``(operand types, attrs) -> result type(s)``; raises TypeRuleError.
    reference: NumPy semantics ``(arrays, attrs) -> array(s)``; the oracle for every test.
    torch: the torch executor's implementation ``(tensors, attrs) -> tensor(s)``.
    effects: names of side effects ("rng", "collective", "io"), or a function of the attrs;
      an op with effects is never removed, merged or reordered by a pass.
    collective: for ops that communicate between the ranks of a mesh axis (ops/collective.py),
      their semantics over one group of ranks ``(args_by_member, attrs) -> results_by_member``:
      ``args_by_member[i]`` holds member i's operand arrays (members in group order, i.e. by
      coordinate along the axis) and the result has one entry (an array or a tuple of arrays)
      per member. ``reference`` then covers only a group of one rank.
    """

    name: str
    operands: tuple[str, ...]
    infer: TypeRule
    reference: Callable
    torch: Callable
    attrs: tuple[AttrSpec, ...] = ()
    effects: frozenset[str] | Callable[[dict], frozenset[str]] = frozenset()
    cost: Callable[[list[TensorType], list[TensorType], dict], Cost] = default_cost
    doc: str = ""
    # Algebraic facts used by canonicalization (generic rules read these; no op names).
    commutative: bool = False
    right_identity: float | None = None     # op(x, c) == x when c is a splat of this value
    left_identity: float | None = None      # op(c, x) == x
    involution: bool = False                # op(op(x)) == x
    idempotent: bool = False                # op(op(x)) == op(x)
    elementwise: bool = False
    # linear_in: the operands the op is linear in, so a partial sum of them passes through
    # it (sharding rules read this: a partial-sum placement survives the op). With
    # linear_joint false (mul, div's numerator) the op is linear in each separately: at most
    # one may be partial. With linear_joint true (add, sub, where's branches) it is linear in
    # all of them together: they must be partial over the same axes.
    linear_in: frozenset[int] = frozenset()
    linear_joint: bool = False
    # Accepts storage dtypes (f8/f4/i4/...); data-movement ops (cost=movement_cost) always do.
    storage_ok: bool = False
    # Facts the padding rewrite reads (parallel/pad.py: a dim padded with zeros so that a mesh
    # axis divides it). pad_zeros: where the result is zero in the padding of a dim its
    # sharding rule passes from operands to a result (one of PAD_ZEROS, "" when nothing is
    # known). pad_ranged: for a dim the rule marks ranged (an index range the op looks up),
    # ``attrs -> None`` when the op may take it padded, or the reason it may not; None: never.
    # pad_logits: the operand holding class logits, which padding masks with -inf on the
    # padded classes. size_attrs: ``(attrs, result types) -> attrs`` restating the attributes
    # that give result sizes (reshape's shape), for new (padded) result types.
    pad_zeros: str = ""
    pad_ranged: Callable[[dict], str | None] | None = None
    pad_logits: int | None = None
    size_attrs: Callable[[dict, list[TensorType]], dict] | None = None
    # An optional torch implementation that writes results into operand buffers: pairs
    # (result index, operand index). The torch executor uses it only when the graph lets it
    # (the result is an output aliasing that operand, an input donated by the caller and
    # read by no later node).
    torch_inplace: Callable | None = None
    inplace: tuple[tuple[int, int], ...] = ()
    collective: Callable | None = None
    # An optional torch implementation that starts the communication and returns a
    # ``Pending`` (ops/collective.py) at once; the executor waits for it where the result is
    # first read, so computation overlaps the transfer (TorchProgram(overlap=True)).
    torch_async: Callable | None = None
    # An optional builder of the torch executor's step function for one node, called once
    # when a program is prepared: ``node -> (tensors, attrs) -> tensor(s)``. The fused-kernel
    # op compiles its kernel here, so a program's run time holds no compilation.
    torch_prepare: Callable | None = None
    defined_at: Location | None = None
    _attr_index: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._attr_index.update({a.name: a for a in self.attrs})

    # --- operands -------------------------------------------------------------------
    @property
    def min_operands(self) -> int:
        return sum(1 for o in self.operands if not o.endswith("?"))

    @property
    def variadic(self) -> bool:
        return any(o.startswith("*") for o in self.operands)

    def check_arity(self, n: int) -> None:
        lo, hi = self.min_operands, len(self.operands)
        if self.variadic:
            if n < lo:
                raise TypeRuleError(f"{self.name} takes at least {lo} operand(s) ({self._sig()}), got {n}")
        elif not lo <= n <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise TypeRuleError(f"{self.name} takes {want} operand(s) ({self._sig()}), got {n}")

    def _sig(self) -> str:
        return ", ".join(self.operands)

    # --- attributes -----------------------------------------------------------------
    def attr_spec(self, name: str) -> AttrSpec | None:
        return self._attr_index.get(name)

    def normalize_attrs(self, attrs: dict | None) -> dict:
        """Fill defaults, coerce values to canonical form, reject unknown/missing attributes."""
        attrs = attrs or {}
        for k in attrs:
            if k not in self._attr_index:
                known = ", ".join(a.name for a in self.attrs) or "none"
                raise AttributeError_(
                    f"{self.name}: unknown attribute '{k}'{suggest(k, self._attr_index)}; its attributes are: {known}"
                )
        out = {}
        for spec in self.attrs:
            if spec.name in attrs:
                out[spec.name] = spec.normalize(attrs[spec.name], self.name)
            elif spec.default is REQUIRED:
                raise AttributeError_(f"{self.name}: missing required attribute '{spec.name}' ({ATTR_KINDS[spec.kind]})")
            else:
                out[spec.name] = spec.default
        return out

    def non_default_attrs(self, attrs: dict) -> dict:
        """The attributes a printer needs to show: those that differ from the default."""
        out = {}
        for k, v in attrs.items():
            spec = self._attr_index.get(k)
            if spec is None or spec.default is REQUIRED or not _same(v, spec.default):
                out[k] = v
        return out

    # --- rules ----------------------------------------------------------------------
    def infer_types(self, types: list[TensorType], attrs: dict) -> tuple[TensorType, ...]:
        self.check_arity(len(types))
        storage_ok = self.storage_ok or self.cost is movement_cost
        for t in types:
            if t.dtype.storage and not storage_ok:
                raise storage_error(t.dtype, self.name)
        out = self.infer(types, attrs)
        outs = (out,) if isinstance(out, TensorType) else tuple(out)
        for t in outs:
            if t.dtype.storage and not storage_ok:
                raise storage_error(t.dtype, self.name)
        return outs

    def effects_of(self, attrs: dict) -> frozenset[str]:
        e = self.effects
        return e(attrs) if callable(e) else e

    def cost_of(self, ins: list[TensorType], outs: list[TensorType], attrs: dict) -> Cost:
        return self.cost(ins, outs, attrs)

    # --- rules of later layers (in their RuleTables; None until the layer is imported) ---
    @property
    def vjp(self) -> Callable | str | None:
        """The reverse-mode rule: the "vjp" table of partita/autodiff/rules.py."""
        return rule_of("vjp", self.name)

    @property
    def sharding(self) -> Callable | None:
        """The placement rule: the "sharding" table of partita/parallel/sharding.py."""
        return rule_of("sharding", self.name)


def _same(a: Any, b: Any) -> bool:
    # -0.0 is not the default 0.0: dropping it from the text would lose its sign.
    if type(a) is float and type(b) is float:
        return a == b and str(a) == str(b)
    return type(a) is type(b) and a == b


OPS: dict[str, OpDef] = {}

# The values of OpDef.pad_zeros: where a result is zero in the padding of a dim.
PAD_ZEROS = {
    "": "nothing is known: the padding may hold anything",
    "any": "where any operand carrying the dim is zero there (a product: mul, matmul)",
    "all": "where every operand carrying the dim is zero there (neg, moves, sum, optimizer updates)",
    "all_operands": "where every operand carries the dim and is zero there (add, sub, concat: an operand "
                    "broadcast along the dim would fill the padding)",
    "always": "whatever the operands hold (embedding_grad, cross_entropy_grad)",
}


def register(op: OpDef) -> OpDef:
    """Add ``op`` to ``OPS``, recording where it was defined. Names are unique, and the record
    is checked (attribute kinds, defaults, operand names) before it is added, so that a
    malformed record fails when its module is imported rather than when a graph uses it."""
    where = op.defined_at or _definition_site(sys._getframe(1))
    problems = record_problems(op)
    if op.name in OPS:
        problems.insert(0, f"registered twice (first at {OPS[op.name].defined_at})")
    if problems:
        raise ValueError(f"op '{op.name}' at {where}: " + "; ".join(problems))
    if op.defined_at is None:
        # The one write to a record, before anyone can see it: OPS does not hold it yet.
        object.__setattr__(op, "defined_at", where)
    OPS[op.name] = op
    return op


_OPS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _definition_site(frame: Any) -> Location:
    """The line that defines the op: the caller of ``register``, or, when that caller is a
    family helper (``_unary``, ``_binary``, ...), the line that called the helper. Walks out
    of function frames while their caller is still inside partita/ops, stopping at module
    level, so ``partita ops relu`` names relu's own line, not the helper's ``register``."""
    f = frame
    while f.f_code.co_name != "<module>" and f.f_back is not None and \
            os.path.abspath(f.f_back.f_code.co_filename).startswith(_OPS_DIR):
        f = f.f_back
    return Location(f.f_code.co_filename, f.f_lineno)


def record_problems(op: OpDef) -> list[str]:
    """What is malformed in ``op`` (empty when nothing): unknown attribute kinds, defaults or
    choices that do not fit their kind, repeated attribute or operand names, optional
    operands before required ones, fields that must be functions and are not."""
    out: list[str] = []
    if not op.name.isidentifier():
        out.append("the name must be an identifier (letters, digits, '_')")
    seen: set[str] = set()
    for a in op.attrs:
        if not isinstance(a, AttrSpec):
            out.append(f"attrs holds {a!r}, not an AttrSpec")
            continue
        if a.name in seen:
            out.append(f"attribute '{a.name}' is declared twice")
        seen.add(a.name)
        if a.kind not in ATTR_KINDS:
            out.append(f"attribute '{a.name}' has kind '{a.kind}'{suggest(a.kind, ATTR_KINDS)}; "
                       f"the kinds are: {', '.join(ATTR_KINDS)}")
            continue
        values = [] if a.default is REQUIRED or a.default is None else [("default", a.default)]
        values += [("choice", c) for c in a.choices or ()]
        for what, v in values:
            try:
                norm = a.normalize(v, op.name)
            except AttributeError_ as e:
                out.append(f"attribute '{a.name}': the {what} does not fit ({e})")
                continue
            if not _same(norm, v):
                # Defaults go into nodes as written: a non-canonical one (an int for a float,
                # a list for ints) would print and compare differently from a parsed value.
                out.append(f"attribute '{a.name}': {what} {v!r} is not in canonical form (write {norm!r})")
    names: set[str] = set()
    optional = False
    for o in op.operands:
        base = o.lstrip("*").rstrip("?")
        if not base.isidentifier():
            out.append(f"operand '{o}' is not a name (with an optional leading '*' or trailing '?')")
        if base in names:
            out.append(f"operand '{base}' is declared twice")
        names.add(base)
        if o.endswith("?"):
            optional = True
        elif optional:
            out.append(f"operand '{o}' follows an optional operand (only trailing operands may be optional)")
    for fname in ("infer", "reference", "torch", "cost"):
        if not callable(getattr(op, fname)):
            out.append(f"{fname} must be a function, got {getattr(op, fname)!r}")
    for fname in ("pad_ranged", "size_attrs", "torch_inplace", "torch_async", "torch_prepare", "collective"):
        v = getattr(op, fname)
        if v is not None and not callable(v):
            out.append(f"{fname} must be a function or None, got {v!r}")
    if op.pad_zeros not in PAD_ZEROS:
        out.append(f"pad_zeros is {op.pad_zeros!r}{suggest(op.pad_zeros, PAD_ZEROS)}; it is one of "
                   f"{', '.join(map(repr, PAD_ZEROS))}")
    if op.pad_logits is not None and not (isinstance(op.pad_logits, int) and 0 <= op.pad_logits < len(op.operands)):
        out.append(f"pad_logits is {op.pad_logits!r}, not the index of an operand")
    bad = sorted(i for i in op.linear_in if not (isinstance(i, int) and 0 <= i < len(op.operands)))
    if bad or not isinstance(op.linear_in, frozenset):
        out.append(f"linear_in must be a frozenset of operand indices (0..{len(op.operands) - 1}), "
                   f"got {op.linear_in!r}")
    return out


# --- rule tables: per-op rules that later layers keep beside the frozen records ------------

RULE_TABLES: dict[str, "RuleTable"] = {}


class RuleTable:
    """The rules of one kind ("vjp", "sharding") that a layer above the ops keeps per op.

    Declared once, by the layer that owns the kind (``RULES = RuleTable("vjp")`` in
    autodiff/rules.py); rules go in with ``RULES.register("matmul", fn)``, the decorator
    ``@RULES.rule("softmax", "log_softmax")`` or ``RULES["exp"] = fn``, all the same call: the
    op must be registered in ``OPS`` and may get one rule per table. ``get(op, default)`` is
    the rule, or ``fallback(record)`` for ops with none registered (the broadcast rule of an
    elementwise op), or ``default``. The records are never changed; ``OpDef.vjp`` and
    ``OpDef.sharding`` read these tables.
    """

    declared_at: Location

    def __init__(self, kind: str, fallback: Callable[[OpDef], Any] | None = None) -> None:
        if kind in RULE_TABLES:
            raise ValueError(f"rule table '{kind}' declared twice (first in {RULE_TABLES[kind].declared_at})")
        f = sys._getframe(1)
        self.kind = kind
        self.fallback = fallback
        self.declared_at = Location(f.f_code.co_filename, f.f_lineno)
        self._rules: dict[str, Any] = {}
        self._where: dict[str, Location] = {}
        self._derived: dict[OpDef, Any] = {}  # fallback results, per record
        self._overrides: dict[str, Any] = {}
        RULE_TABLES[kind] = self

    def register(self, op: str, rule: Any) -> Any:
        """Give ``op`` its rule of this kind; an unknown op or a second rule is an error."""
        f = sys._getframe(1)
        while f.f_code.co_filename == __file__ and f.f_back is not None:  # out of rule()/__setitem__
            f = f.f_back
        where = Location(f.f_code.co_filename, f.f_lineno)
        if op not in OPS:
            raise ValueError(f"{where}: {self.kind} rule for unknown op '{op}'{suggest(op, OPS)}")
        if op in self._rules:
            raise ValueError(f"{where}: {self.kind} rule for '{op}' registered twice (first at {self._where[op]})")
        if rule is None:
            raise ValueError(f"{where}: {self.kind} rule for '{op}' is None")
        self._rules[op] = rule
        self._where[op] = where
        return rule

    def __setitem__(self, op: str, rule: Any) -> None:
        self.register(op, rule)

    def rule(self, *ops: str) -> Callable[[Any], Any]:
        """Decorator: register the function as the rule of each of ``ops``."""
        def deco(fn: Any) -> Any:
            for op in ops:
                self.register(op, fn)
            return fn
        return deco

    def get(self, op: str, default: Any = None) -> Any:
        """The rule of ``op``: registered, else the fallback's for its record, else ``default``."""
        if op in self._overrides:
            r = self._overrides[op]
        else:
            r = self._rules.get(op)
            record = OPS.get(op)
            if r is None and self.fallback is not None and record is not None:
                if record not in self._derived:
                    self._derived[record] = self.fallback(record)
                r = self._derived[record]
        return default if r is None else r

    def __contains__(self, op: object) -> bool:
        """Whether a rule was registered for ``op`` (the fallback does not count)."""
        return op in self._rules

    def names(self) -> frozenset[str]:
        return frozenset(self._rules)

    def where(self, op: str) -> Location | None:
        """Where the rule of ``op`` was registered."""
        return self._where.get(op)

    @contextmanager
    def override(self, op: str, rule: Any) -> Iterator[None]:
        """For tests: ``op`` has ``rule`` instead (None: no rule at all) within the block."""
        if op not in OPS:
            raise ValueError(f"{self.kind} rule for unknown op '{op}'{suggest(op, OPS)}")
        had, old = op in self._overrides, self._overrides.get(op)
        self._overrides[op] = rule
        try:
            yield
        finally:
            if had:
                self._overrides[op] = old
            else:
                del self._overrides[op]

    def __repr__(self) -> str:
        return f"<RuleTable {self.kind}: {len(self._rules)} rules>"


def rule_of(kind: str, op: str) -> Any:
    """The rule of ``op`` in the table ``kind``; None when the table is not declared (its
    layer is not imported) or holds none for the op."""
    table = RULE_TABLES.get(kind)
    return None if table is None else table.get(op)


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOpError(f"unknown op '{name}'{suggest(name, OPS)}") from None


# --- helpers shared by the type rules of several families ----------------------------

def broadcast_shapes(*shapes: tuple[int, ...], op: str = "op") -> tuple[int, ...]:
    """NumPy broadcasting of shapes; raises TypeRuleError naming the mismatching dims."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        off = rank - len(s)
        for i, d in enumerate(s):
            o = out[off + i]
            if o == 1:
                out[off + i] = d
            elif d != 1 and d != o:
                raise TypeRuleError(
                    f"{op}: shapes {' and '.join(_fmt_shape(x) for x in shapes)} do not broadcast "
                    f"(dim {off + i - rank} is {o} in one and {d} in another; each pair must be equal or 1)"
                )
    return tuple(out)


def _fmt_shape(s: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, s)) + "]"


def normalize_axis(axis: int, rank: int, op: str, what: str = "axis") -> int:
    """Map a possibly negative axis into [0, rank); raise if out of range."""
    if not -rank <= axis < rank:
        raise TypeRuleError(f"{op}: {what} {axis} is out of range for a tensor of rank {rank} (valid: {-rank}..{rank - 1})")
    return axis % rank


def normalize_axes(axes, rank: int, op: str) -> tuple[int, ...]:
    out = tuple(sorted(normalize_axis(a, rank, op) for a in axes))
    if len(set(out)) != len(out):
        raise TypeRuleError(f"{op}: axes {list(axes)} repeat an axis")
    return out


def numel(shape) -> int:
    return prod(shape)
