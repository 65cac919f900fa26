"""The strategies of ``parallelize``, one module each, behind one interface (``base.Strategy``).

Built in, in registration order (the order ``str`` of a parsed strategy names them):

- ``pp`` (pp.py): pipeline stages over the pp axis (partita/parallel/pipeline/), each stage
  parallelized with the other words;
- ``dp`` (dp.py): the batch split over the data-parallel axis;
- ``zero1``, ``zero2``, ``zero3`` (zero.py): dp with the optimizer state, the gradients and
  the params sharded in turn;
- ``megatron`` and ``sp`` (megatron.py): tensor and sequence parallelism, with the
  vocabulary padding and the vocab-parallel embedding of vocab.py.

A new strategy is a new module: subclass ``Strategy``, set its ``name`` and ``axis``,
implement ``annotate(ctx)`` (and ``passes(ctx)`` where it rewrites the per-rank program), and
``register`` it; ``parallelize(graph, mesh, "dp+mine")`` then finds it by its word.
"""

from .base import (UPDATE_OPS, AnnotationContext, ParsedStrategy, Strategy, StrategyError, default_strategy,
                   lookup, parse_strategy, register, registered, unregister)
from . import pp, dp, zero, megatron, ep  # noqa: F401,E402  (register the built-in strategies, in this order)
from . import cp  # noqa: F401,E402  (context parallelism, after them)

__all__ = ["AnnotationContext", "ParsedStrategy", "Strategy", "StrategyError", "UPDATE_OPS", "default_strategy",
           "lookup", "parse_strategy", "register", "registered", "unregister"]
