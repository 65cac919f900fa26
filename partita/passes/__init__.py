"""Graph-to-graph passes, the pass manager and the rewrite-rule engine.

Every pass partita ships is listed by name in ``PASS_MODULES`` (manager.py) with the module
that defines it, which a pipeline imports on first use: ``PassManager.parse("canonicalize,
cse,dce")`` finds any of them whatever was imported before. Importing this package registers
the graph cleanups (``dce``, ``cse``, ``fold-constants``, ``canonicalize``,
``split-projections``, ``fuse-activations``, ``quantize``) in ``PASSES``.
"""

from .manager import PASS_MODULES, PASSES, Pass, PassManager, find_pass, get_pass, pass_names, register_pass
from . import canonicalize, cse, dce, fold, fuse, quantize, split_projections  # noqa: E402,F401  (registration)

__all__ = ["PASS_MODULES", "PASSES", "Pass", "PassManager", "find_pass", "get_pass", "pass_names", "register_pass"]
