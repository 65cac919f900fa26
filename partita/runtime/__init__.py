"""Running per-rank programs for real: processes, torch.distributed groups, steps.

``run_ranks`` (launch.py) spawns one process per mesh rank, or joins torchrun's group, and
runs each rank's program for a number of steps; see docs/runtime.md.
"""

from .launch import CollectiveFailure, LaunchError, RankFailure, RunResult, run_ranks

__all__ = ["CollectiveFailure", "LaunchError", "RankFailure", "RunResult", "run_ranks"]
