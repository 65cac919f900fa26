"""Device meshes, as the parallel layer names them.

``Mesh`` is a record of the IR and lives in partita/ir/mesh.py; this module re-exports it so
that ``from partita.parallel.mesh import Mesh`` keeps working. Code outside partita/parallel
should import it from ``partita.ir.mesh`` (or ``partita.ir``).
"""

from ..ir.mesh import Mesh, MeshError

__all__ = ["Mesh", "MeshError"]
