"""Graph-to-graph passes, the pass manager and the rewrite-rule engine.

Importing this package registers the built-in passes (``dce``, ``cse``, ``fold-constants``,
``canonicalize``, ``split-projections``, ``fuse-activations``) in ``PASSES``. Pipelines: ``PassManager.parse("canonicalize,cse,dce")``.
"""

from .manager import PASSES, Pass, PassManager, get_pass, register_pass
from . import canonicalize, cse, dce, fold, fuse, quantize, split_projections  # noqa: E402,F401  (registration)

__all__ = ["PASSES", "Pass", "PassManager", "get_pass", "register_pass"]
