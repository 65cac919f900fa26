"""``partita ops``: the op registry as a table, or one op in detail."""

from __future__ import annotations

import argparse
from typing import Any

from .common import EXIT_OK, short


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("ops", parents=[common], help="list the registered ops",
                       description="List every registered op with its operands and attributes; "
                                   "with NAME, show one op in detail.")
    s.add_argument("name", nargs="?", metavar="NAME", help="show only this op, in detail")
    s.set_defaults(handler=cmd_ops)


def cmd_ops(args: argparse.Namespace) -> int:
    """``partita ops``: the op registry as a table, or one op in detail."""
    from ..ops.registry import OPS, get_op

    if args.name:
        print(describe_op(get_op(args.name)))
        return EXIT_OK
    import textwrap

    sigs = {name: f"{name}({', '.join(OPS[name].operands)})" for name in OPS}
    width = min(40, max(len(s) for s in sigs.values()) + 2)
    lines = []
    for name in sorted(OPS):
        op = OPS[name]
        sig = sigs[name]
        lines.append((sig.ljust(width) + _first_sentence(op.doc)).rstrip() if len(sig) < width
                     else sig + "\n" + " " * width + _first_sentence(op.doc))
        if op.attrs:
            attrs = "{" + ", ".join(_format_attr_spec(a) for a in op.attrs) + "}"
            lines.append(textwrap.fill(attrs, width=100, initial_indent="    ", subsequent_indent="     ",
                                       break_on_hyphens=False))
    print("\n".join(lines))
    print(f"\n{len(OPS)} ops. 'partita ops NAME' shows one op in detail.")
    return EXIT_OK


def describe_op(op) -> str:
    """A few lines about one op record: signature, attributes, facts, effects, doc."""
    lines = [f"{op.name}({', '.join(op.operands)})"]
    if op.doc:
        lines.append(f"  {op.doc}")
    if op.attrs:
        lines.append("  attributes:")
        for a in op.attrs:
            lines.append(f"    {_format_attr_spec(a)}" + (f"  (one of {', '.join(map(repr, a.choices))})"
                                                            if a.choices else ""))
    facts = [f for f in ("elementwise", "commutative", "involution", "idempotent") if getattr(op, f)]
    for side in ("left_identity", "right_identity"):
        val = getattr(op, side)
        if val is not None:
            facts.append(f"{side.replace('_', ' ')} {val:g}")
    if facts:
        lines.append(f"  facts: {', '.join(facts)}")
    effects = op.effects
    if callable(effects):
        lines.append("  effects: depend on the attributes")
    elif effects:
        lines.append(f"  effects: {', '.join(sorted(effects))} (never removed, merged or reordered)")
    if op.defined_at is not None:
        lines.append(f"  defined at {short(op.defined_at.file)}:{op.defined_at.line}")
    return "\n".join(lines)


def _format_attr_spec(a) -> str:
    from ..ir.printer import format_attr
    from ..ops.registry import REQUIRED

    if a.default is REQUIRED:
        return f"{a.name}: {a.kind}"
    try:
        default = format_attr(a.default)
    except TypeError:
        default = repr(a.default)
    return f"{a.name}: {a.kind} = {default}"


def _first_sentence(doc: str) -> str:
    doc = " ".join(doc.split())
    return doc if len(doc) <= 58 else doc[:55] + "..."
