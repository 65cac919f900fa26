"""``partita.view(obj, "out.html")``: one self-contained HTML page (no network request) that
shows a graph (module groups collapsed to layers, search, each node's ``.pir`` line, types,
placement and source), a parallel program (placed graph beside the per-rank program, each
collective and why it exists, placements on the mesh), a pipeline schedule (Gantt chart per
rank), a simulation (per-rank streams, waits, memory) and two graphs before and after a pass side
by side with the differences marked. See docs/view.md.
"""

from __future__ import annotations

import os
from typing import Any

from ..ir.diagnostics import PartitaError
from .data import DETAIL_LIMIT, page_data
from .page import render_page

__all__ = ["view", "write_page", "ViewError", "DETAIL_LIMIT", "page_data", "render_page"]

KNOWN = "a Graph (a .pir file), a pair of Graphs (before, after), a ParallelProgram or PipelineProgram (partita.parallelize) or a SimResult " \
        "(partita.cluster.simulate)"


class ViewError(PartitaError):
    """A view that cannot be written (the message says what to change)."""


def view(obj: Any, path: str | os.PathLike, *, sim: Any = None, run: Any = None, title: str | None = None,
         detail_limit: int = DETAIL_LIMIT) -> str:
    """Write the page of ``obj`` to ``path`` and return the path. ``sim``: a SimResult of
    ``obj`` shown as its timeline; ``run``: a pipeline's launch result (``partita.launch``),
    its measured bubble drawn under the predicted schedule; ``detail_limit``: graphs with more
    nodes show their layers only (the page says so)."""
    write_page(obj, path, sim=sim, run=run, title=title, detail_limit=detail_limit)
    return os.fspath(path)


def write_page(obj: Any, path: str | os.PathLike, *, sim: Any = None, run: Any = None, title: str | None = None,
               detail_limit: int = DETAIL_LIMIT) -> dict:
    """``view``, returning the page's data (``page_data``) instead of the path."""
    if run is not None and not hasattr(getattr(run, "run", run), "recv_seconds"):
        raise ViewError(f"view: run= takes what partita.launch returns (a LaunchResult or its RunResult), "
                        f"not a {type(run).__name__}")
    try:
        data = page_data(obj, detail_limit=detail_limit, sim=sim, run=run)
    except TypeError:
        raise ViewError(f"view: cannot show a {type(obj).__name__}; give {KNOWN}") from None
    except ValueError:
        raise ViewError(f"view: a graph of the pair has more than {detail_limit} nodes, too many to compare node by "
                        "node; raise detail_limit or view each graph alone (its layers)") from None
    name = title or _title(obj)
    text = render_page(data, name)
    p = os.fspath(path)
    try:
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise ViewError(f"view: cannot write {p}: {e.strerror or e} (give a path in a folder you can write)") from None
    return data


def _title(obj: Any) -> str:
    """A page title from the object: the graph's name, the mesh and strategy."""
    if isinstance(obj, (tuple, list)) and len(obj) == 2:
        return f"before / after: @{getattr(obj[0], 'name', '?')}"
    g = getattr(obj, "name", None)
    if isinstance(g, str):
        return f"@{g}"
    mesh = getattr(obj, "mesh", None)
    strategy = getattr(obj, "strategy", None)
    return " ".join(str(x) for x in (type(obj).__name__, mesh, strategy) if x is not None)
