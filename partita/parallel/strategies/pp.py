"""``pp``: pipeline parallelism over the ``pp`` mesh axis. Unlike the other words it does not
annotate one global graph: ``parallelize`` cuts the model into stages, unrolls the schedule
into one program per pp rank (partita/parallel/pipeline/) and parallelizes each of those
with the rest of the strategy (``pp+dp+megatron``: dp and megatron within every stage)."""

from __future__ import annotations

from .base import AnnotationContext, Strategy, StrategyError, register


class PipelineParallel(Strategy):
    name = "pp"
    aliases: tuple[str, ...] = ("pipeline",)
    axis = "pp"
    order = 10

    def annotate(self, ctx: AnnotationContext) -> None:
        raise StrategyError("strategy pp is applied by parallelize itself (it makes one program per stage); it "
                            "annotates no single global graph")


register(PipelineParallel)
