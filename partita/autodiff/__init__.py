"""Autodiff and training: the ``grad`` pass, vjp rules, optimizer passes, training steps.

Importing this package declares the vjp rule table (read as ``op.vjp``) and registers the
``grad``, ``sgd`` and ``adamw`` passes.
"""

from .grad import AutodiffError, GradResult, grad
from . import rules  # noqa: F401  (declares the vjp rule table)
from .optim import apply_adamw, apply_sgd
from .training import Trainer, training_step

__all__ = ["AutodiffError", "GradResult", "Trainer", "apply_adamw", "apply_sgd", "grad", "training_step"]
