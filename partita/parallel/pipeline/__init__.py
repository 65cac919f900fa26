"""Pipeline parallelism as rewrites of the SSA graph: the stage cut (stages.py), the chunks'
forward and split backward (stage_graphs.py), schedules as data (schedule.py), and the
unrolled per-rank programs (build.py); ``partita.parallelize(..., strategy="pp+...")`` puts
them together with the SPMD strategies (driver.py)."""

from .schedule import SCHEDULES, Action, PipelineError, Schedule, make_schedule

__all__ = ["Action", "PipelineError", "SCHEDULES", "Schedule", "make_schedule"]
