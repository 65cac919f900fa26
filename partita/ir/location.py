"""Source locations: where a node came from, a small frozen record carried by the IR (and by
the parse errors, which is why it is a module of its own below ``diagnostics``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Location:
    """Where something came from: a file, a 1-based line and an optional 1-based column, and
    the module path of the model that ran it (``scope``, e.g. ``"transformer.h.3.attn"``;
    empty when unknown), which is how a pipeline cut names a layer.

    ``recompute`` is empty on the model's own nodes; on a node that recomputes a forward value
    for the backward (activation recomputation, partita/autodiff/recompute.py) it names the
    policy that made it (``"cheap"``, ``"selective"``, ``"full"``). It lives here because the
    location is what every transformation carries from a node to what it makes of it (clone,
    text, the parallel partition's local nodes and collectives, the pipeline's copies), so
    later passes and cost models can tell recomputed work from the model's own."""

    file: str
    line: int
    col: int = 0
    scope: str = ""
    recompute: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" + (f":{self.col}" if self.col else "")
