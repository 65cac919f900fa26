"""The project's error types. Every error a user can cause is a ``PartitaError``.

Messages say where (file:line:col or the node), what was found and what was expected, so the
CLI can print them as they are, without a traceback.
"""

from __future__ import annotations

from .location import Location


class PartitaError(Exception):
    """Base of every error partita raises on purpose."""


class ParseError(PartitaError):
    """Malformed ``.pir`` text. Carries the location and renders the line with a caret."""

    def __init__(self, message: str, loc: Location, line_text: str = "") -> None:
        self.message = message
        self.loc = loc
        self.line_text = line_text
        super().__init__(self.render())

    def render(self) -> str:
        out = f"{self.loc.file}:{self.loc.line}:{self.loc.col}: error: {self.message}"
        if self.line_text:
            text = self.line_text.rstrip("\n").expandtabs(1)
            out += f"\n  {text}\n  {' ' * max(0, self.loc.col - 1)}^"
        return out


class TypeRuleError(PartitaError):
    """An op's type rule rejected its operands or attributes (no node context yet)."""


class AttributeError_(PartitaError):
    """An attribute is missing, unknown or of the wrong type (no node context yet)."""


class VerifyError(PartitaError):
    """The graph breaks an IR invariant. The message names the node and shows IR around it."""


class GraphEditError(PartitaError):
    """A graph edit that would break SSA or the use lists."""


class UnknownOpError(PartitaError):
    """An op name that is not in the registry."""


class PassError(PartitaError):
    """A pass failed, or a pipeline string is malformed."""


class ExecutionError(PartitaError):
    """A graph could not be run: missing inputs or weights, wrong input shapes."""


class IntegerDivisionByZeroError(ExecutionError):
    """An integer division or remainder (int_div, remainder, fmod) met a zero divisor at run
    time; PyTorch raises there too. The message names the node."""


class DenseTooLargeError(ExecutionError):
    """A dense tensor attribute (a splat, until then kept as one value) is too large to build."""


class WeightsError(PartitaError):
    """A weights file is missing, corrupt, or does not match the graph."""


def suggest(name: str, candidates) -> str:
    """' (did you mean 'x'?)' for the closest candidate, or ''."""
    import difflib

    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def given(x: object) -> str:
    """``x`` as an error message shows what was given: its repr (cut short) and its type."""
    r = repr(x)
    return f"{r if len(r) <= 60 else r[:57] + '...'} ({type(x).__name__})"
