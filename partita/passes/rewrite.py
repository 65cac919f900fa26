"""Declarative rewrite rules and the driver that applies them to a fixed point.

A rule is a pattern and a replacement, written in a small Python DSL::

    X = Var("x")
    rule("mul-by-one", Op("mul", X, Splat(1.0)), X, fix=("broadcast", "cast"))
    rule("neg-neg", Op("neg", Op("neg", X)), X)
    rule("sub-self-int", Op("sub", X, X, where=lambda n: n.results[0].type.dtype.is_int),
         lambda m: emit_splat(m.emit, m.type, 0))

Patterns:
  ``Var(name, where=pred)``  binds any value (the same name must bind the same value);
  ``Op(op, *operands, bind=name, where=pred(node), **attrs)``  matches a value produced by
      ``op``; attribute keywords are required values, or predicates on the value; operands
      of an op whose record says ``commutative`` are tried in both orders;
  ``Splat(value, bind=name)``  matches a constant whose elements all equal ``value``: a
      ``constant`` with a splat DenseAttr or a ``full`` (``value=None`` matches any splat).

Replacements: a ``Var`` (reuse a matched value), an ``Op`` pattern (new nodes; attribute
keywords are values or functions of the ``Match``), or a callable ``fn(match) -> Value |
None`` that may emit nodes with ``match.emit(...)`` (None means "does not apply").

The driver replaces the root only when the replacement has exactly the root's result type;
a rule may allow the driver to ``fix`` a mismatch by inserting ``broadcast_to`` (shape) or
``cast`` (dtype). It never rewrites a node with effects and erases matched nodes that became
dead and have no effects. Rules name the ops they use; a rule whose ops are not registered
is skipped, so rules may mention ops that a later op family adds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError, PassError
from ..ir.graph import Graph, Node, Value
from ..ir.types import Location, TensorType
from ..ops.registry import OPS

__all__ = ["Var", "Op", "Splat", "Rule", "rule", "Match", "RewriteEvent", "RewriteDriver", "apply_rules",
           "has_effects", "effect_classes", "splat_value", "erase_if_dead", "emit_splat", "SPLAT_READERS"]


# --- facts about nodes shared by the passes -------------------------------------------------

def has_effects(node: Node) -> bool:
    """True when the node's op declares effects for its attributes (or is not registered,
    which a pass must treat as effectful: nothing is known about it)."""
    opdef = OPS.get(node.op)
    if opdef is None:
        return True
    e = opdef.effects
    return bool(e(node.attrs) if callable(e) else e)


PURE, EFFECTFUL, DEPENDS = 0, 1, 2


def effect_classes() -> dict[str, int]:
    """For each registered op: PURE (no effects for any attributes), EFFECTFUL (always),
    or DEPENDS (effects are a function of the attributes: ask ``has_effects(node)``).
    Lets a pass decide per node with one dict lookup; unknown ops count as effectful."""
    out = {}
    for name, d in OPS.items():
        e = d.effects
        out[name] = DEPENDS if callable(e) else EFFECTFUL if e else PURE
    return out


def _dense_splat(node: Node) -> Any:
    v = node.attrs.get("value")
    s = v.splat_value() if isinstance(v, DenseAttr) else None  # never builds a splat's array
    return _NOT_SPLAT if s is None else s


def _full_splat(node: Node) -> Any:
    v = node.attrs.get("value")
    if not isinstance(v, (bool, int, float)) or len(node.results) != 1:
        return _NOT_SPLAT
    # The value the tensor holds, after rounding to its dtype (1e-50 in f32 is 0).
    with np.errstate(all="ignore"):
        return np.asarray(v).astype(node.results[0].type.dtype.np).item()


class _NotSplat:
    def __repr__(self) -> str:
        return "NOT_SPLAT"


_NOT_SPLAT: Any = _NotSplat()

# How to read the single value of a splat constant, per op that can produce one. A table,
# so the matcher and constant folding share one definition and new producers are one line.
SPLAT_READERS: dict[str, Callable[[Node], Any]] = {
    "constant": _dense_splat,
    "full": _full_splat,
}


def splat_value(value: Value) -> Any:
    """The Python scalar every element of ``value`` equals, when its producer is a splat
    constant; None otherwise."""
    node = value.producer
    if node is None:
        return None
    reader = SPLAT_READERS.get(node.op)
    if reader is None:
        return None
    s = reader(node)
    return None if s is _NOT_SPLAT else s


def sole_user(v: Value) -> Node | None:
    """The one node that reads ``v``, once, when ``v`` is not also a graph output."""
    if v.is_output or len(v.users) != 1:
        return None
    ((u, count),) = v.users.items()
    return u if count == 1 else None


def erase_if_dead(graph: Graph, node: Node) -> int:
    """Erase ``node`` if its results are unused and it has no effects, then do the same for
    the producers of its operands, transitively. Returns the number of nodes erased."""
    stack = [node]
    erased = 0
    while stack:
        n = stack.pop()
        if n.graph is not graph:
            continue
        for r in n.results:
            if r.users or r._out_uses:
                break
        else:
            if has_effects(n):
                continue
            operands = n.operands
            graph.erase(n)
            erased += 1
            for v in operands:
                p = v.producer
                if p is not None and not v.users and not v._out_uses:
                    stack.append(p)
    return erased


# --- the pattern DSL ------------------------------------------------------------------------

class Pattern:
    """Base of pattern nodes."""

    def ops(self) -> set[str]:
        return set()

    def _compile(self, ctx: "_Context") -> Callable[[Value, dict], bool]:
        raise NotImplementedError


def _producer_requirement(p: Pattern) -> frozenset[str] | None:
    """Ops of which at least one operand's producer must be, for the op pattern ``p`` to
    match (None: no such requirement). Used to skip nodes cheaply, before any matching."""
    req: set[str] = set()
    for o in getattr(p, "operands", ()):
        if isinstance(o, Op):
            req.add(o.op)
        elif isinstance(o, Splat):
            req.update(SPLAT_READERS)
    return frozenset(req) if req else None


class Var(Pattern):
    """A pattern variable: matches any value; a second use must match the same value."""

    __slots__ = ("name", "where")

    def __init__(self, name: str, where: Callable[[Value], bool] | None = None) -> None:
        self.name = name
        self.where = where

    def _compile(self, ctx: "_Context") -> Callable[[Value, dict], bool]:
        name, where = self.name, self.where

        def match(value: Value, b: dict) -> bool:
            prev = b.get(name)
            if prev is None:
                if where is not None and not where(value):
                    return False
                b[name] = value
                return True
            return prev is value
        return match

    def __repr__(self) -> str:
        return f"Var({self.name!r})"


class Op(Pattern):
    """An op pattern (in a pattern) or an op to build (in a replacement)."""

    __slots__ = ("op", "operands", "attrs", "bind", "where", "result")

    def __init__(self, op: str, *operands: Pattern, bind: str | None = None,
                 where: Callable[[Node], bool] | None = None, result: int = 0, **attrs: Any) -> None:
        for o in operands:
            if not isinstance(o, Pattern):
                raise TypeError(f"Op({op!r}): operands must be patterns (Var, Op, Splat), got {o!r}")
        self.op = op
        self.operands = operands
        self.attrs = attrs
        self.bind = bind
        self.where = where
        self.result = result

    def ops(self) -> set[str]:
        out = {self.op}
        for o in self.operands:
            out |= o.ops()
        return out

    def _compile(self, ctx: "_Context") -> Callable[[Value, dict], bool]:
        op, result = self.op, self.result
        match_node = self._compile_node(ctx)

        def match(value: Value, b: dict) -> bool:
            node = value.producer
            if node is None or node.op != op or value.index != result:
                return False
            return match_node(node, b)
        return match

    def _compile_node(self, ctx: "_Context") -> Callable[[Node, dict], bool]:
        """A matcher of a node already known to have this op: the driver indexes rules by
        root op, so it matches roots by node and skips the producer and op checks."""
        op, bind, where = self.op, self.bind, self.where
        subs = [p._compile(ctx) for p in self.operands]
        n_operands = len(subs)
        checks = tuple(self.attrs.items())
        commutative = n_operands == 2 and OPS[op].commutative

        def attrs_ok(node: Node) -> bool:
            a = node.attrs
            for k, want in checks:
                got = a.get(k)
                if callable(want):
                    if not want(got):
                        return False
                elif type(got) is not type(want) or got != want:
                    return False
            return True

        if commutative:
            s0, s1 = subs

            def operands_ok(ops: list[Value], b: dict) -> bool:
                # Matchers only add bindings, so undoing a failed order drops the new keys.
                n = len(b)
                if s0(ops[0], b) and s1(ops[1], b):
                    return True
                _truncate(b, n)
                if s0(ops[1], b) and s1(ops[0], b):
                    return True
                _truncate(b, n)
                return False
        else:
            def operands_ok(ops: list[Value], b: dict) -> bool:
                for s, v in zip(subs, ops):
                    if not s(v, b):
                        return False
                return True

        def match_node(node: Node, b: dict) -> bool:
            ops = node.operands
            if len(ops) != n_operands:
                return False
            if checks and not attrs_ok(node):
                return False
            if not operands_ok(ops, b):
                return False
            if where is not None and not where(node):
                return False
            if bind is not None:
                b[bind] = node
            return True
        return match_node

    def __repr__(self) -> str:
        args = ", ".join(map(repr, self.operands))
        return f"Op({self.op!r}{', ' + args if args else ''})"


def _truncate(b: dict, n: int) -> None:
    """Drop the bindings added after the first ``n`` (dicts keep insertion order)."""
    if n == 0:
        b.clear()
    elif len(b) > n:
        for k in list(b)[n:]:
            del b[k]


class Splat(Pattern):
    """A splat constant (``constant`` with one repeated value, or ``full``) equal to
    ``value`` (any splat when ``value`` is None). NaN never matches a number."""

    __slots__ = ("value", "bind", "where")

    def __init__(self, value: float | int | bool | None = None, *, bind: str | None = None,
                 where: Callable[[Any], bool] | None = None) -> None:
        self.value = value
        self.bind = bind
        self.where = where

    def _compile(self, ctx: "_Context") -> Callable[[Value, dict], bool]:
        want, bind, where = self.value, self.bind, self.where
        read = ctx.splat_of

        def match(value: Value, b: dict) -> bool:
            node = value.producer
            if node is None:
                return False
            s = read(node)
            if s is _NOT_SPLAT:
                return False
            if want is not None and not s == want:
                return False
            if where is not None and not where(s):
                return False
            if bind is not None:
                prev = b.get(bind)
                if prev is not None and prev is not value:
                    return False
                b[bind] = value
            return True
        return match

    def __repr__(self) -> str:
        return f"Splat({self.value!r})"


# --- rules --------------------------------------------------------------------------------

FIXES = ("broadcast", "cast")


@dataclass(frozen=True, eq=False)
class Rule:
    """A named (pattern, replacement) pair and where it was written."""

    name: str
    pattern: Op
    replacement: Any
    where: Callable[["Match"], bool] | None
    fix: frozenset[str]
    requires: frozenset[str]
    defined_at: Location
    doc: str = ""

    def ops(self) -> set[str]:
        """Every op the rule needs registered: in its pattern, its replacement, ``requires``."""
        out = self.pattern.ops() | set(self.requires)
        if isinstance(self.replacement, Pattern):
            out |= self.replacement.ops()
        return out

    def available(self) -> bool:
        """Whether every op the rule needs is registered (the driver skips it otherwise)."""
        return all(o in OPS for o in self.ops())

    def __repr__(self) -> str:
        return f"<Rule {self.name} at {self.defined_at}>"


def rule(name: str, pattern: Op, replacement: Any, *, where: Callable[["Match"], bool] | None = None,
         fix: Iterable[str] = (), requires: Iterable[str] = (), doc: str = "",
         defined_at: Location | None = None) -> Rule:
    """Create a rewrite rule, recording the file and line of the call (or ``defined_at``).

    ``where(match)`` is a final condition on the whole match; ``fix`` lists the type fixes
    the driver may insert ("broadcast": broadcast_to, "cast": cast) when the replacement's
    type differs from the root's; ``requires`` names ops a callable replacement emits.
    """
    if not isinstance(pattern, Op):
        raise TypeError(f"rule {name!r}: the pattern's root must be an Op, got {pattern!r}")
    if not (isinstance(replacement, (Var, Op)) or callable(replacement)):
        raise TypeError(f"rule {name!r}: the replacement must be a Var, an Op or a callable, got {replacement!r}")
    fix = frozenset(fix)
    bad = fix - set(FIXES)
    if bad:
        raise ValueError(f"rule {name!r}: unknown fix {sorted(bad)}; choose from {', '.join(FIXES)}")
    if defined_at is None:
        f = sys._getframe(1)
        defined_at = Location(f.f_code.co_filename, f.f_lineno)
    return Rule(name, pattern, replacement, where, fix, frozenset(requires), defined_at, doc)


class Match:
    """The bindings of one successful match, and a way to emit nodes before its root."""

    __slots__ = ("graph", "root", "bindings", "created", "_builder")

    def __init__(self, graph: Graph, root: Node, bindings: dict) -> None:
        self.graph = graph
        self.root = root
        self.bindings = bindings
        self.created: list[Node] = []
        self._builder: Builder | None = None

    def __getitem__(self, name: str) -> Any:
        return self.bindings[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.bindings.get(name, default)

    @property
    def type(self) -> TensorType:
        """The type the replacement must have: the root's result type."""
        return self.root.results[0].type

    def splat(self, name: str) -> Any:
        """The scalar of the splat constant bound to ``name``."""
        return splat_value(self.bindings[name])

    def emit(self, op: str, *operands: Value, **attrs: Any) -> Value:
        """Emit ``op`` before the root (with the root's source location); its first result."""
        b = self._builder
        if b is None:
            b = self._builder = Builder(self.graph, loc=self.root.loc)
            b.set_insertion_before(self.root)
        node = b.emit_node(op, operands, attrs)
        self.created.append(node)
        return node.results[0]


@dataclass(frozen=True, slots=True)
class RewriteEvent:
    """One firing of a rule: which rule (and where it is written) rewrote which node."""

    rule: str
    rule_loc: Location
    op: str
    node_loc: Location | None

    def __str__(self) -> str:
        where = f" at {self.node_loc}" if self.node_loc is not None else ""
        return f"{self.rule} ({_short(self.rule_loc)}) rewrote {self.op}{where}"


def _short(loc: Location) -> str:
    """A rule's location relative to the directory holding the partita package."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    f = loc.file
    if f.startswith(root + os.sep):
        f = f[len(root) + 1:]
    return f"{f}:{loc.line}"


# --- the driver ---------------------------------------------------------------------------

class _Context:
    """Per-run state shared by compiled matchers: a cache of splat values of constants."""

    def __init__(self) -> None:
        self.cache: dict[int, tuple[Node, Any]] = {}

    def splat_of(self, node: Node) -> Any:
        reader = SPLAT_READERS.get(node.op)
        if reader is None:
            return _NOT_SPLAT
        hit = self.cache.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        s = reader(node)
        self.cache[id(node)] = (node, s)
        return s


class _Compiled:
    __slots__ = ("rule", "match", "build", "where")

    def __init__(self, rule: Rule, match, build) -> None:
        self.rule, self.match, self.build, self.where = rule, match, build, rule.where


def _compile_replacement(rep: Any, ctx: _Context) -> Callable[[Match], Value | None]:
    if isinstance(rep, Var):
        name = rep.name
        return lambda m: m.bindings[name]
    if isinstance(rep, Op):
        subs = [_compile_replacement(o, ctx) for o in rep.operands]
        op, attrs, result = rep.op, tuple(rep.attrs.items()), rep.result

        def build(m: Match) -> Value | None:
            operands = []
            for s in subs:
                v = s(m)
                if v is None:
                    return None
                operands.append(v)
            kw = {k: (v(m) if callable(v) else v) for k, v in attrs}
            v = m.emit(op, *operands, **kw)
            if not result:
                return v
            node = v.producer
            assert node is not None, "Match.emit returns a result of the node it built"
            return node.results[result]
        return build
    if isinstance(rep, Splat):
        raise TypeError("Splat is a pattern; to build a constant use a callable replacement")
    return rep


class RewriteDriver:
    """Applies a set of rules to a graph until none matches.

    One forward sweep visits every node once; rules are indexed by their root op, so a node
    whose op roots no rule costs one dict lookup. Nodes created by a rewrite are revisited
    at once (before the sweep moves on), so rewrites that enable others reach a fixed point
    in the same sweep: patterns look only upstream of their root, and a rewrite changes only
    its root's users (later in the sweep) and the new nodes.
    """

    def __init__(self, rules: Iterable[Rule], *, trace: list[RewriteEvent] | None = None,
                 max_rewrites: int | None = None) -> None:
        self.ctx = _Context()
        self.trace = trace
        self.max_rewrites = max_rewrites
        self.index: dict[str, list[_Compiled]] = {}
        self.rules = [r for r in rules if r.available()]
        for r in self.rules:
            compiled = _Compiled(r, r.pattern._compile_node(self.ctx), _compile_replacement(r.replacement, self.ctx))
            self.index.setdefault(r.pattern.op, []).append(compiled)
        # Ops whose records declare no effects whatever the attributes: no per-node check.
        self.pure = {name for name in self.index
                     if not callable(OPS[name].effects) and not OPS[name].effects}
        # Per root op, the producer ops one of which some operand must have for any of its
        # rules to match; None when a rule matches any operands (x - x, say).
        self.gate: dict[str, frozenset[str] | None] = {}
        for op, entries in self.index.items():
            reqs = [_producer_requirement(c.rule.pattern) for c in entries]
            known = [r for r in reqs if r is not None]
            self.gate[op] = frozenset[str]().union(*known) if len(known) == len(reqs) else None
        self.counts: dict[str, int] = {}

    def run(self, graph: Graph) -> int:
        """Rewrite ``graph`` in place to a fixed point; returns the number of rewrites."""
        index, gate = self.index, self.gate
        limit = self.max_rewrites if self.max_rewrites is not None else 10 * len(graph) + 1000
        total = 0
        pending: list[Node] = []
        node = graph.first
        while node is not None:
            nxt = node._next
            entries = index.get(node.op)
            if entries is None:
                node = nxt
                continue
            need = gate[node.op]
            if need is not None:
                for v in node.operands:
                    p = v.producer
                    if p is not None and p.op in need:
                        break
                else:
                    node = nxt
                    continue
            if self._try(graph, node, entries, pending):
                total += 1
                while pending:
                    p = pending.pop()
                    if p.graph is not graph:
                        continue
                    e = index.get(p.op)
                    if e is not None and self._try(graph, p, e, pending):
                        total += 1
                        if total > limit:
                            self._diverged(limit)
                if total > limit:
                    self._diverged(limit)
                # Rewrites erase only the root and nodes upstream of it, so the successor is
                # normally alive; should one be erased, its kept links lead past it.
                while nxt is not None and nxt.graph is not graph:
                    nxt = nxt._next
            node = nxt
        return total

    def _diverged(self, limit: int) -> None:
        top = sorted(self.counts.items(), key=lambda kv: -kv[1])[:5]
        raise PassError(f"rewriting did not reach a fixed point after {limit} rewrites; the rules that fired "
                        f"most are {', '.join(f'{k} ({v}x)' for k, v in top)}: they probably undo each other")

    def _try(self, graph: Graph, node: Node, entries: list[_Compiled], pending: list[Node]) -> bool:
        results = node.results
        if len(results) != 1 or (node.op not in self.pure and has_effects(node)):
            return False
        root = results[0]
        for c in entries:
            b: dict = {}
            if not c.match(node, b):
                continue
            m = Match(graph, node, b)
            r = c.rule
            if c.where is not None and not c.where(m):
                continue
            try:
                new = c.build(m)
            except PartitaError:
                # The replacement's type rule rejects these operands (sub of a bool, say):
                # the rule does not apply here.
                new = None
            if new is not None and new.type != root.type:
                new = self._fix_type(m, new, root.type, r.fix)
            if new is None or new is root:
                for n in reversed(m.created):
                    if n.graph is graph:
                        graph.erase(n)
                continue
            self._commit(graph, node, new, m, r, pending)
            return True
        return False

    def _fix_type(self, m: Match, v: Value, want: TensorType, fix: frozenset[str]) -> Value | None:
        """Insert cast/broadcast_to so ``v`` gets type ``want``; None when not allowed or impossible."""
        try:
            if v.type.dtype != want.dtype:
                if "cast" not in fix or "cast" not in OPS:
                    return None
                v = m.emit("cast", v, dtype=want.dtype)
            if v.type.shape != want.shape:
                if "broadcast" not in fix or "broadcast_to" not in OPS:
                    return None
                v = m.emit("broadcast_to", v, shape=want.shape)
        except PartitaError:  # the type rules refuse the cast or the broadcast
            return None
        return v if v.type == want else None

    def _commit(self, graph: Graph, node: Node, new: Value, m: Match, r: Rule, pending: list[Node]) -> None:
        if self.trace is not None:
            self.trace.append(RewriteEvent(r.name, r.defined_at, node.op, node.text_loc or node.loc))
        self.counts[r.name] = self.counts.get(r.name, 0) + 1
        graph.replace_all_uses(node.results[0], new)
        erase_if_dead(graph, node)
        # New nodes are behind the sweep: visit them now. Nothing else needs a second look:
        # the root's users come later in the sweep, and patterns only look upstream.
        pending.extend(m.created)


def apply_rules(graph: Graph, rules: Iterable[Rule], *, trace: list[RewriteEvent] | None = None) -> int:
    """Apply ``rules`` to ``graph`` to a fixed point; returns the number of rewrites."""
    return RewriteDriver(rules, trace=trace).run(graph)


def constant_array(node: Node) -> np.ndarray | None:
    """The value of a constant-producing node (no operands, no effects) by its reference;
    None when the node is not one."""
    opdef = OPS.get(node.op)
    if opdef is None or node.operands or has_effects(node) or len(node.results) != 1:
        return None
    t = node.results[0].type
    with np.errstate(all="ignore"):
        a = np.asarray(opdef.reference([], node.attrs))
        return a.astype(t.dtype.np) if a.dtype != t.dtype.np else a


def scalar_attr(value: Any, dtype) -> Any:
    """``value`` as the Python scalar a splat attribute of ``dtype`` holds: bool, int, or the
    shortest float that converts back to the same ``dtype`` value (so 0.1 in f32 prints as
    0.1, not 0.10000000149011612)."""
    with np.errstate(all="ignore"):
        arr = np.asarray(value).astype(dtype.np)
    exact = arr.item()
    if dtype.is_float and dtype.bits < 64 and isinstance(exact, float):
        short = float(str(arr.reshape(-1)[0] if arr.ndim else arr[()]))
        if np.asarray(short).astype(dtype.np).tobytes() == arr.tobytes():
            return short
    return exact


def emit_splat(emit: Callable[..., Value], t: TensorType, value: Any) -> Value | None:
    """Emit a tensor of type ``t`` filled with ``value`` through ``emit(op, *operands,
    **attrs)``: a ``full`` when that op is registered, else a ``constant``; None when
    neither is."""
    if "full" in OPS:
        return emit("full", value=scalar_attr(value, t.dtype), shape=t.shape, dtype=t.dtype)
    if "constant" in OPS:
        return emit("constant", value=DenseAttr(np.full(t.shape, value, dtype=t.dtype.np)))
    return None
