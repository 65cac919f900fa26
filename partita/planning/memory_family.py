"""The planner's memory family: pipelined candidates that fit only by saving memory where it is
held. Recomputation per stage: under 1F1B stage i of p holds min(M, p - i) microbatches'
activations, so the first stages may recompute while the later ones do not (the stages that
recompute get fewer layers, ``bounds.recompute_stage_cut``); for each pipelined candidate that
does not fit without recomputation and fits with it, the cheapest assignment that fits
(selective, then full, on the first k stages, k least). zero3 beside a pipeline (``pp+zero3``):
every state sharded over dp on each stage, offered where the same mesh with zero1 does not fit.
Both are priced by the simulator like the other families (planner.FAMILIES)."""

from __future__ import annotations

import dataclasses

from .bounds import Candidate, memory_bytes
from .shape import ModelShape


def stage_recompute_candidates(shape: ModelShape, cands: list[Candidate], mems: dict[Candidate, float],
                               cap: float, recomputes: tuple[str, ...]) -> list[Candidate]:
    """Per-stage recomputation for each 1F1B candidate over ``cap`` without recomputation whose
    uniform recomputation fits: the least number of first stages recomputing (selective where
    it is searched and the attention's scores are kept, else full) that fits."""
    if "none" not in recomputes:
        return []
    heavier = [r for r in ("selective", "full") if r in recomputes and (r == "full" or not shape.fused_attention)]
    out: list[Candidate] = []
    for c in cands:
        if c.pp == 1 or c.schedule != "1f1b" or c.recompute != "none" or c.kind() != "base" or mems[c] <= cap:
            continue
        for heavy in heavier:
            if mems.get(dataclasses.replace(c, recompute=heavy), cap + 1) > cap:
                continue
            got = least_stages(shape, c, heavy, cap)
            if got is not None:
                out.append(got)
                break
    return out


def least_stages(shape: ModelShape, c: Candidate, heavy: str, cap: float) -> Candidate | None:
    """``c`` with ``heavy`` recomputation on its first k stages (k < pp least) that fits ``cap``, or None."""
    for k in range(1, c.pp):
        m = dataclasses.replace(c, stage_recompute=(heavy,) * k + ("none",) * (c.pp - k))
        if memory_bytes(shape, m) <= cap:
            return m
    return None


def pipeline_zero3_candidates(shape: ModelShape, cands: list[Candidate], mems: dict[Candidate, float],
                              cap: float) -> list[Candidate]:
    """``pp+zero3`` for each pipelined zero1 candidate over ``cap`` where the memory bound says zero3
    holds less (zero3 moves 1.5 times dp's traffic and gathers each layer's params again per
    microbatch: it pays only where zero1 does not fit)."""
    out = []
    for c in cands:
        if c.pp > 1 and c.zero == "zero1" and c.kind() == "base" and mems[c] > cap:
            z = dataclasses.replace(c, zero="zero3", saves_memory=True)
            if memory_bytes(shape, z) < mems[c]:
                out.append(z)
    return out
