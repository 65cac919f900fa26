"""The process groups a rank's collectives run on: mesh axis -> torch.distributed group.

A per-rank program names its collectives by mesh axis (``all_reduce {axis="tp"}``); which
ranks that means depends on the rank running it. Each process therefore records, once, the
``torch.distributed`` ProcessGroup of its own group along every mesh axis, and the torch
implementations of the collective ops (collective.py, beside this module) look it up here.

The table sits below the ops because the ops read it; the layers above fill it in:
``partita.parallel.comm.new_mesh_groups`` builds the groups of a mesh, and the runtime sets
them with ``set_groups`` or ``use_groups`` (``partita.parallel.comm`` re-exports these names).

The map is process-wide (a module global, not a context variable) because one process is
one rank: executor threads and the thread that set the groups must see the same map.
``use_groups`` sets it for a ``with`` block and restores the previous map afterwards.

Group-local ranks must follow mesh coordinates (group rank i = coordinate i along the axis).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from ..ir.diagnostics import ExecutionError


class CommError(ExecutionError):
    """A collective ran without the process group it needs (the message says how to set it)."""


_groups: dict[str, Any] = {}


def set_groups(groups: Mapping[str, Any]) -> dict[str, Any]:
    """Make ``groups`` (mesh axis name -> ProcessGroup of this rank's group along that axis)
    the map the collectives of this process use; returns the previous map."""
    global _groups
    previous = _groups
    _groups = dict(groups)
    return previous


def clear_groups() -> None:
    """Forget every group (collectives over an axis larger than one rank then fail clearly)."""
    set_groups({})


def current_groups() -> dict[str, Any]:
    """A copy of the map in force."""
    return dict(_groups)


@contextmanager
def use_groups(groups: Mapping[str, Any]) -> Iterator[None]:
    """Run a block with ``groups`` in force, restoring the previous map afterwards."""
    previous = set_groups(groups)
    try:
        yield
    finally:
        set_groups(previous)


def group(axis: str) -> Any:
    """The ProcessGroup of this rank's group along mesh axis ``axis``."""
    try:
        return _groups[axis]
    except KeyError:
        have = ", ".join(sorted(_groups)) or "none"
        raise CommError(
            f"no process group for mesh axis '{axis}' in this process (groups set: {have}); call "
            f"partita.parallel.comm.set_groups(new_mesh_groups(mesh)) after "
            f"torch.distributed.init_process_group, before running the per-rank program") from None
