"""The process groups a rank's collectives run on: mesh axis -> torch.distributed group.

A per-rank program names its collectives by mesh axis (``all_reduce {axis="tp"}``); which
ranks that means depends on the rank running it. Each process therefore records, once, the
``torch.distributed`` ProcessGroup of its own group along every mesh axis, and the torch
implementations of the collective ops (partita/ops/collective.py) look it up here.

The map is process-wide (a module global, not a context variable) because one process is
one rank: executor threads and the thread that set the groups must see the same map.
``use_groups`` sets it for a ``with`` block and restores the previous map afterwards.

Group-local ranks must follow mesh coordinates (group rank i = coordinate i along the axis).
``new_mesh_groups`` builds groups that do: ``torch.distributed.new_group`` orders a group's
ranks by global rank, and ``Mesh.group_of`` lists a group in increasing global rank.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from ..ir.diagnostics import ExecutionError
from .mesh import Mesh


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


def new_mesh_groups(mesh: Mesh | str, rank: int | None = None, backend: str | None = None,
                    timeout: Any = None) -> dict[str, Any]:
    """Create the process groups of every mesh axis and return this rank's (axis -> group).

    Every rank must call this with the same mesh, collectively: ``torch.distributed.new_group``
    has to be called by all ranks for every group, in the same order, even for groups a rank
    is not in. The world size must equal the mesh size. ``timeout`` (a ``datetime.timedelta``)
    bounds every collective on these groups; torch's default for a new gloo group is 30
    minutes, not the default group's timeout, so a runtime that must notice a dead peer
    passes its own.
    """
    import torch.distributed as dist

    mesh = Mesh.of(mesh)
    if not dist.is_initialized():
        raise CommError("torch.distributed is not initialized: call torch.distributed.init_process_group first")
    world = dist.get_world_size()
    if world != mesh.size:
        raise CommError(f"the mesh {mesh} has {mesh.size} ranks but the process group has {world}; "
                        f"launch {mesh.size} processes or use a mesh of {world} ranks")
    rank = dist.get_rank() if rank is None else rank
    mine: dict[str, Any] = {}
    for axis in mesh.names:
        for ranks in mesh.groups(axis):
            g = dist.new_group(ranks=ranks, backend=backend, timeout=timeout)
            if rank in ranks:
                mine[axis] = g
    return mine
