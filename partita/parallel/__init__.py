"""Multi-device parallelism: meshes, placements, sharding rules, and the passes and
strategies that rewrite a graph into per-rank SPMD programs (see docs/parallel.md;
``partita.parallelize`` is the entry point, partita/runtime runs the result)."""

from ..ir.mesh import Mesh, MeshError
from ..ir.placement import Placement, PlacementError
from . import sharding  # noqa: F401  (declares the sharding rule table)
from . import propagate as _propagate  # noqa: F401  (registers the propagate pass)
from . import partition as _partition  # noqa: F401  (registers the partition pass)
from . import bucket as _bucket  # noqa: F401  (registers bucket-gradients and order-collectives)

__all__ = ["Mesh", "MeshError", "Placement", "PlacementError"]
