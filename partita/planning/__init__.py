"""The automatic planner (docs/plan.md): ``plan(model, cluster, memory=...)`` returns a ``Plan``.

It reads the model's shape, enumerates meshes, strategies, pipeline options and
recomputation, prunes them by analytic memory and time bounds, and prices the survivors with
the simulator (partita/cluster). ``Plan`` and ``PlanError`` load without the search.
"""

from __future__ import annotations

from typing import Any

from .plan import Plan
from .shape import ModelShape, PlanError, model_shape


def plan(model: Any, cluster: Any, memory: Any = None, **options: Any) -> Plan:
    """The fastest plan that fits (see ``partita.planning.planner.plan``)."""
    from .planner import plan as search

    return search(model, cluster, memory, **options)


def report_text(p: Plan) -> str:
    """The plan and its explanation as text."""
    from .planner import report_text as text

    return text(p)


__all__ = ["Plan", "PlanError", "ModelShape", "model_shape", "plan", "report_text"]
