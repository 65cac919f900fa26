"""The op records. Importing this package registers every op family in ``OPS``."""

from .registry import OPS, AttrSpec, Cost, OpDef, get_op, register  # noqa: F401
from . import elementwise, reduce, linalg, shape, nn, optim, collective, quant, select  # noqa: F401,E402  (registration)
from . import backward  # noqa: F401,E402  (registration; reads the nn and shape records)
from . import index_scan  # noqa: F401,E402  (registration: scatter_elements, cumprod)

__all__ = ["OPS", "AttrSpec", "Cost", "OpDef", "get_op", "register"]
