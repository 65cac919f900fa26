"""The op records. Importing this package registers every op family in ``OPS``."""

from .registry import OPS, AttrSpec, Cost, OpDef, get_op, register  # noqa: F401
from . import elementwise, reduce, linalg, shape, nn  # noqa: F401,E402  (registration)

__all__ = ["OPS", "AttrSpec", "Cost", "OpDef", "get_op", "register"]
