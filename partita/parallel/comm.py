"""The process groups of a mesh: building them, and the names of the table that holds them.

``new_mesh_groups`` creates the ``torch.distributed`` groups of every axis of a mesh and
returns this rank's (mesh axis -> ProcessGroup). The table the collectives read them from
is below the ops, in partita/ops/process_groups.py, since the ops' torch implementations
look groups up there; this module re-exports its names (``set_groups``, ``use_groups``,
``clear_groups``, ``current_groups``, ``group``, ``CommError``), so
``partita.parallel.comm.set_groups(new_mesh_groups(mesh))`` is how a rank sets its groups.

Group-local ranks must follow mesh coordinates (group rank i = coordinate i along the axis).
``new_mesh_groups`` builds groups that do: ``torch.distributed.new_group`` orders a group's
ranks by global rank, and ``Mesh.group_of`` lists a group in increasing global rank.
"""

from __future__ import annotations

from typing import Any

from ..ops.process_groups import (CommError, clear_groups, current_groups, group, set_groups,  # noqa: F401
                                  use_groups)
from ..ir.mesh import Mesh

__all__ = ["CommError", "clear_groups", "current_groups", "group", "new_mesh_groups", "set_groups", "use_groups"]


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
