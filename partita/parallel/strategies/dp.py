"""``dp``: data parallelism. Every ``input``-role graph input (the batch and the targets) is
split on dim 0 over the data-parallel axis. Params stay replicated, so their gradients come
out as partial sums that the optimizer update needs whole: one all_reduce per gradient
(``bucket-gradients`` fuses them)."""

from __future__ import annotations

from .base import AnnotationContext, Strategy, StrategyError, register


class DataParallel(Strategy):
    name = "dp"
    aliases: tuple[str, ...] = ("ddp",)
    axis = "dp"
    exclusive = "data-parallel"
    order = 30

    def annotate(self, ctx: AnnotationContext) -> None:
        axis = ctx.axis(self)
        g = ctx.graph
        batch = [v for v in g.inputs if v.role == "input"]
        if not batch:
            raise StrategyError(f"strategy {self.name}: @{g.name} has no 'input'-role graph input to split "
                                "over the batch; data parallelism needs the batch as an input")
        for v in batch:
            ctx.split_dim0(v, axis, f"strategy {self.name}")


register(DataParallel)
