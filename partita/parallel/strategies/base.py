"""The interface every strategy implements, the registry of strategy words, and the parsing of
``strategy="dp+megatron"`` against a mesh.

A strategy is one word of ``strategy="a+b"``: an instance of a ``Strategy`` subclass,
registered under its ``name`` (and ``aliases``) with ``register``. It says which mesh axis it
works on (``axis``: the axis of that name, or the only axis of a one-axis mesh), what it
annotates (``annotate(ctx)``: placements on values of the global graph, through an
``AnnotationContext``), and which passes it adds to the per-rank program (``passes(ctx)``).
``parse_strategy`` looks the words up, checks that they go together and resolves each one's
axis; ``parallelize`` then calls ``annotate`` of each in ``order``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ...ir.diagnostics import PartitaError
from ...ir.graph import Graph, Value
from ...ir.printer import value_names
from ...ops.kinds import UPDATE_OPS
from ...ir.mesh import Mesh
from ...ir.placement import Placement

if TYPE_CHECKING:
    from ...passes.manager import Pass
    from ..pad import PadReport


class StrategyError(PartitaError):
    """A strategy or annotation that cannot be applied (the message says what and how to fix it)."""




class Strategy:
    """One strategy word. Subclasses set the class attributes and implement ``annotate``.

    - ``name``: the word in ``strategy="a+b"``; ``aliases``: other words for it.
    - ``axis``: the name of the mesh axis it works on; on a one-axis mesh it takes that axis
      whatever its name. None: it needs no axis.
    - ``exclusive``: a group name (``"data-parallel"``); a strategy text may name at most one
      strategy of a group.
    - ``requires``: the strategies it works only with, and ``requires_why``, the reason that
      the error gives.
    - ``order``: strategies annotate in increasing ``order`` (megatron's weight splits come
      before the data-parallel presets, which shard the optimizer state on top of them).
    - ``word_axes``: words (the name or an alias) that promise a layout, each with the mesh
      axes it needs by name (zero3's ``hsdp``: ``dp`` and ``fsdp``), and ``axes_why``, what
      they are for; a mesh without one of them is refused when that word is used.
    - ``listed_apart``: a phrase (``"for long sequences"``) after which the unknown-word
      message lists the word apart from the main list; empty: in the main list.

    An instance is shared by every ``parallelize`` call: keep per-call state on the context.
    """

    name: str = ""
    aliases: tuple[str, ...] = ()
    axis: str | None = None
    exclusive: str | None = None
    requires: tuple[str, ...] = ()
    requires_why: str = ""
    order: int = 50
    word_axes: dict[str, tuple[str, ...]] = {}
    axes_why: str = ""
    # A phrase after which the unknown-word message lists this word apart from the others
    # ("for long sequences"); empty: in the main list.
    listed_apart: str = ""

    def annotate(self, ctx: "AnnotationContext") -> None:
        """Place values of ``ctx.graph`` (``ctx.place`` before propagation, ``ctx.late`` after
        it); may rewrite the graph (a padding, a gathered copy)."""
        raise NotImplementedError(f"strategy '{self.name}' does not implement annotate()")

    def passes(self, ctx: "AnnotationContext") -> "Sequence[Pass]":
        """Passes run on the per-rank program after ``partition`` and before the bucketing and
        ordering of the collectives, in this order; each is timed in the plan under its name."""
        return ()

    def __repr__(self) -> str:
        return f"<strategy {self.name}>"


_REGISTRY: dict[str, Strategy] = {}  # name -> strategy, in registration order
_ALIASES: dict[str, str] = {}  # alias -> name


def register(strategy: "Strategy | type[Strategy]") -> Any:
    """Register a strategy (an instance, or a class with a no-argument constructor, so that it
    works as a class decorator) under its name and aliases; returns its argument."""
    inst = strategy() if isinstance(strategy, type) else strategy
    if not isinstance(inst, Strategy):
        raise StrategyError(f"register: {strategy!r} is not a partita.parallel.strategies.Strategy; subclass it")
    words = (inst.name,) + tuple(inst.aliases)
    for w in words:
        if not isinstance(w, str) or not w or any(c in w for c in "+, ") or w != w.strip() or w == "none":
            raise StrategyError(f"register {type(inst).__name__}: the strategy word {w!r} must be non-empty text "
                                "without '+', ',' or spaces, and not 'none'")
        owner = _REGISTRY.get(w) or _REGISTRY.get(_ALIASES.get(w, ""))
        if owner is not None and type(owner) is not type(inst):
            raise StrategyError(f"register {type(inst).__name__}: the strategy word '{w}' is taken by "
                                f"{type(owner).__module__}.{type(owner).__name__}; choose another word")
    if inst.axis is not None and not isinstance(inst.axis, str):
        raise StrategyError(f"register {type(inst).__name__}: axis must be a mesh axis name or None, got "
                            f"{inst.axis!r}")
    _REGISTRY[inst.name] = inst
    for a in inst.aliases:
        _ALIASES[a] = inst.name
    return strategy


def unregister(name: str) -> None:
    """Remove the strategy registered as ``name`` (and its aliases)."""
    inst = _REGISTRY.pop(name, None)
    if inst is None:
        raise StrategyError(f"unregister: no strategy is registered as '{name}'; registered: {', '.join(_REGISTRY)}")
    for a in inst.aliases:
        _ALIASES.pop(a, None)


def registered() -> tuple[str, ...]:
    """The registered strategy words, in registration order (aliases left out)."""
    return tuple(_REGISTRY)


def lookup(word: str) -> Strategy:
    """The strategy registered as ``word`` (or as an alias of it)."""
    s = _REGISTRY.get(_ALIASES.get(word, word))
    if s is None:
        known = tuple(_REGISTRY)
        near = difflib.get_close_matches(word, known + tuple(_ALIASES), n=1, cutoff=0.5)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        main = [w for w, st in _REGISTRY.items() if not st.listed_apart]
        apart: dict[str, list[str]] = {}
        for w, st in _REGISTRY.items():
            if st.listed_apart:
                apart.setdefault(st.listed_apart, []).append(w)
        extra = "".join(f" (and {', '.join(ws)} {what})" for what, ws in apart.items())
        raise StrategyError(f"unknown strategy '{word}'{hint}; combine {', '.join(main)} with '+'{extra}, "
                            "e.g. 'dp+megatron' or 'zero2+megatron+sp'")
    return s


@dataclass(frozen=True)
class ParsedStrategy:
    """A parsed strategy text: its strategies in registration order, each with its mesh axis."""

    strategies: tuple[Strategy, ...] = ()
    axes: tuple[str | None, ...] = ()

    def __str__(self) -> str:
        return "+".join(s.name for s in self.strategies) or "none"

    def __bool__(self) -> bool:
        return bool(self.strategies)

    def __contains__(self, name: object) -> bool:
        return any(s.name == name for s in self.strategies)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.strategies)

    def axis_of(self, name: str) -> str | None:
        """The mesh axis of the strategy ``name`` (None: not in this combination)."""
        for s, a in zip(self.strategies, self.axes):
            if s.name == name:
                return a
        return None

    def member(self, group: str) -> Strategy | None:
        """The strategy of the ``exclusive`` group ``group`` in this combination, if any."""
        return next((s for s in self.strategies if s.exclusive == group), None)

    def annotation_order(self) -> list[Strategy]:
        return sorted(self.strategies, key=lambda s: s.order)  # stable: registration order on ties

    # The built-in strategies by their roles (what tests and tools ask).
    @property
    def data(self) -> str | None:
        """The data-parallel preset (dp, zero1, zero2, zero3), or None."""
        s = self.member("data-parallel")
        return s.name if s is not None else None

    @property
    def dp_axis(self) -> str | None:
        s = self.member("data-parallel")
        return self.axis_of(s.name) if s is not None else None

    @property
    def megatron(self) -> bool:
        return "megatron" in self

    @property
    def sequence_parallel(self) -> bool:
        return "sp" in self

    @property
    def tp_axis(self) -> str | None:
        return self.axis_of("megatron")


def _one_of(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def default_strategy(mesh: Mesh) -> str:
    """The strategy a mesh's axis names ask for when none is given: each axis takes the first
    registered strategy that works on an axis of its name (``pp`` -> pp, ``dp`` -> dp, ``tp``
    -> megatron, ``ep`` -> ep); ``"pp=2,dp=4,tp=8"`` -> ``"pp+dp+megatron"``. An axis no
    strategy names is a StrategyError."""
    words = []
    for a in mesh.names:
        hit = next((s.name for s in _REGISTRY.values() if s.axis == a and not s.requires), None)
        if hit is None:
            axes = sorted({s.axis for s in _REGISTRY.values() if s.axis})
            raise StrategyError(f"no strategy works on the mesh axis '{a}' of {mesh} by default (the axes with a "
                                f"default: {', '.join(axes)}); name the axis after its strategy or give the "
                                f"strategy (e.g. --strategy / strategy='dp')")
        words.append(hit)
    return "+".join(words)


def parse_strategy(text: str | None, mesh: Mesh) -> ParsedStrategy:
    """Parse ``"dp+megatron"``-style text against ``mesh``: each word is looked up in the
    registry (aliases too) and works on the mesh axis of its ``axis`` name (or the only axis of
    a one-axis mesh); data-parallel presets use ``dp``, megatron ``tp``."""
    if text is None or text.strip() in ("", "none"):
        return ParsedStrategy()
    words = [p.strip() for p in text.replace(",", "+").split("+") if p.strip()]
    found = [lookup(w) for w in words]
    for w, s in zip(words, found):
        _check_word_axes(text, w, s, mesh)
    groups: dict[str, list[Strategy]] = {}
    for s in found:
        if s.exclusive is not None:
            groups.setdefault(s.exclusive, []).append(s)
    for group, members in groups.items():
        if len(members) > 1:
            every = [s.name for s in _REGISTRY.values() if s.exclusive == group]
            raise StrategyError(f"strategy '{text}' names {' and '.join(s.name for s in members)}; choose one "
                                f"{group} preset ({_one_of(every)})")
    chosen = [s for s in _REGISTRY.values() if s in found]  # registration order, each once
    for s in chosen:
        missing = [r for r in s.requires if r not in {c.name for c in chosen}]
        if missing:
            raise StrategyError(f"strategy '{text}': {s.requires_why or f'{s.name} needs {missing[0]}'}; use it as "
                                f"'{'+'.join(missing)}+{s.name}'")

    def axis(s: Strategy) -> str | None:
        if s.axis is None or s.axis in mesh.names:
            return s.axis
        if len(mesh.names) == 1:
            return mesh.names[0]
        raise StrategyError(f"strategy '{text}': {s.name} needs a mesh axis named '{s.axis}' on the mesh {mesh}; "
                            f"name the axes, e.g. mesh='dp=2,tp=2'")
    axes = [axis(s) for s in chosen]
    for i, (a, ax) in enumerate(zip(chosen, axes)):
        for b, bx in zip(chosen[i + 1:], axes[i + 1:]):
            if ax is not None and ax == bx and a.axis != b.axis:
                raise StrategyError(f"strategy '{text}' puts {a.name} and {b.name} on the same mesh axis '{ax}'; "
                                    f"use a 2-D mesh such as '{a.axis}=2,{b.axis}=2'")
    return ParsedStrategy(tuple(chosen), tuple(axes))


def _check_word_axes(text: str, word: str, s: Strategy, mesh: Mesh) -> None:
    """Raise a StrategyError naming the missing axis when ``word`` asks for mesh axes by name
    (``s.word_axes``) that ``mesh`` lacks."""
    need = s.word_axes.get(word, ())
    missing = [a for a in need if a not in mesh.names]
    if missing:
        why = f" ({s.axes_why})" if s.axes_why else ""
        example = ",".join(f"{a}={mesh.axis_size(a) if a in mesh.names else 2}" for a in need)
        raise StrategyError(f"strategy '{text}': {word} needs the mesh axes {' and '.join(repr(a) for a in need)}"
                            f"{why}; the mesh {mesh} has no axis '{missing[0]}': add it, e.g. mesh='{example}'")


class AnnotationContext:
    """What the strategies of one ``parallelize`` call share: the global graph (a copy of the
    caller's), the mesh, the parsed strategy, and the placements they choose."""

    def __init__(self, graph: Graph, mesh: Mesh, strategy: ParsedStrategy) -> None:
        self.graph = graph
        self.mesh = mesh
        self.strategy = strategy
        self.names = value_names(graph)
        self.notes: list[str] = []
        # Phase 1: annotations that propagation spreads (inputs, weights, gather points).
        self.fixed: dict[Value, Placement] = {}
        # Phase 2: placements of node results that only ask for a reshard where they are
        # produced (gradients, new params), set after propagation so that they do not pull
        # the backward section's operands along with them.
        self.late: dict[Value, Placement] = {}
        # Annotated values that must not pull their producers' operands along (see propagate).
        self.sinks: set[Value] = set()
        # What a vocabulary padding padded (None: nothing); the partition and the program
        # take the real sizes from it.
        self.padding: "PadReport | None" = None
        # What one strategy hands to another (megatron's reduced values to sp), by key.
        self.shared: dict[str, Any] = {}

    def axis(self, strategy: Strategy) -> str:
        """The mesh axis ``strategy`` works on in this combination."""
        a = self.strategy.axis_of(strategy.name)
        assert a is not None, f"{strategy.name} has no axis"
        return a

    def name(self, v: Value) -> str:
        return self.names.get(v, "?")

    def refresh_names(self) -> None:
        """Name the values again (after a rewrite that added or renamed some)."""
        self.names = value_names(self.graph)

    def place(self, v: Value, p: Placement) -> None:
        self.fixed[v] = p

    def split_dim0(self, v: Value, axis: str, why: str) -> None:
        n = self.mesh.axis_size(axis)
        if v.type.rank == 0:
            return
        if v.type.shape[0] % n:
            raise StrategyError(
                f"{why}: %{self.name(v)} has {v.type.shape[0]} rows in dim 0 ({v.type}), which the mesh axis "
                f"'{axis}' of size {n} does not divide; use a batch that is a multiple of {n} or a smaller '{axis}'")
        self.place(v, Placement.split(v.type.rank, {0: axis}))


__all__ = ["AnnotationContext", "ParsedStrategy", "Strategy", "StrategyError", "UPDATE_OPS", "default_strategy",
           "lookup", "parse_strategy", "register", "registered", "unregister"]
