"""Placements, as the parallel layer names them.

``Placement`` is a record of the IR and lives in partita/ir/placement.py; this module
re-exports it so that ``from partita.parallel.placement import Placement`` keeps working.
Code outside partita/parallel should import it from ``partita.ir.placement`` (or
``partita.ir``). Which placements the ops accept is for the sharding rules (sharding.py).
"""

from ..ir.placement import Placement, PlacementError

__all__ = ["Placement", "PlacementError"]
