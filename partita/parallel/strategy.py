"""Strategies and ``parallelize``, as one import (the parallel layer's front door; the runtime,
the command line and the tests import from here).

- the strategies, one module each behind ``Strategy``, and their registry:
  partita/parallel/strategies/ (dp.py, zero.py, megatron.py, vocab.py; base.py holds the
  interface, ``parse_strategy`` and ``StrategyError``);
- ``parallelize`` and ``parse_placement``: partita/parallel/spmd.py;
- ``ParallelProgram`` and ``assemble``: partita/parallel/program.py;
- ``PlanReport``: partita/parallel/report.py.
"""

from .spmd import parallelize, parse_placement
from .program import ParallelProgram, assemble
from .report import PlanReport
from .strategies import (UPDATE_OPS, AnnotationContext, ParsedStrategy, Strategy, StrategyError, lookup,
                         parse_strategy, register, registered, unregister)

__all__ = ["AnnotationContext", "ParallelProgram", "ParsedStrategy", "PlanReport", "Strategy", "StrategyError",
           "UPDATE_OPS", "assemble", "lookup", "parallelize", "parse_placement", "parse_strategy", "register",
           "registered", "unregister"]
