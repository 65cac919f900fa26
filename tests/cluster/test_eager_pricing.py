"""simulate(fusion="eager"): the ops eager PyTorch runs as several kernels priced as that chain."""

from __future__ import annotations

import pytest

import partita
from partita.cluster import load_cluster, simulate
from partita.cluster.cost import CostModel
from partita.cluster.eager import eager_kernels
from partita.cluster.hardware import ClusterError


def _step() -> object:
    fwd = partita.models.llama(2, 64, 4, 32, 256, kv_heads=2, ffn=128, batch=2, dtype="bf16")
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True)


def test_eager_prices_the_chains_and_nothing_else():
    step = _step()
    c = load_cluster("grand-teton-h100-500w")
    fused, eager = CostModel(c), CostModel(c, "eager")
    seen = set()
    for n in step.nodes:     # type: ignore[attr-defined]
        if n.op in ("input", "output", "constant"):
            continue
        f, e = fused.compute_time(n), eager.compute_time(n)
        if eager_kernels(n) is None:
            assert e == f, n.op
        else:
            seen.add(n.op)
            assert e.seconds > f.seconds, n.op
    assert {"rms_norm", "rms_norm_grad", "cross_entropy", "cross_entropy_grad", "adamw_update"} <= seen


def test_rms_norm_chain_bytes():
    fwd = partita.models.llama(1, 64, 4, 32, 256, kv_heads=2, ffn=128, batch=2, dtype="bf16")
    norm = next(n for n in fwd.nodes if n.op == "rms_norm")    # type: ignore[attr-defined]
    e = norm.operands[0].type.numel
    # bf16: cast 6E, pow 8E, mean 4E, mul 8E, cast back 6E, weight 4E (+ a row's bytes)
    assert 36 * e <= sum(eager_kernels(norm) or []) < 37 * e


def test_eager_step_is_slower_and_bad_fusion_is_refused():
    step = _step()
    a = simulate(step, "grand-teton-h100-500w", trace=False, memory=False)
    b = simulate(step, "grand-teton-h100-500w", trace=False, memory=False, fusion="eager")
    assert b.step_time > a.step_time
    with pytest.raises(ClusterError, match="fusion must be one of fused, eager or a collection"):
        CostModel(load_cluster("grand-teton-h100-500w"), "compiled")


def test_a_collection_prices_only_those_ops_and_unknown_names_are_refused():
    step = _step()
    c = load_cluster("grand-teton-h100-500w")
    some = CostModel(c, ("cross_entropy", "adamw_update"))
    fused, eager = CostModel(c), CostModel(c, "eager")
    for n in step.nodes:     # type: ignore[attr-defined]
        if n.op in ("rms_norm", "rms_norm_grad"):
            assert some.compute_time(n) == fused.compute_time(n)
        elif n.op in ("cross_entropy", "adamw_update"):
            assert some.compute_time(n) == eager.compute_time(n)
    with pytest.raises(ClusterError, match="no eager chain is known for softmax; the ops with one are"):
        CostModel(c, ["softmax"])
    from partita.cluster.simulator import SimulationError
    with pytest.raises(SimulationError, match="simulate: fusion must be one of fused, eager"):
        simulate(step, c, trace=False, memory=False, fusion="compiled")


def test_eager_memory_counts_the_chains_intermediates():
    from partita.cluster.eager import transient_bytes
    from partita.cluster.memory_report import memory_report

    step = _step()
    fused = memory_report(step)     # type: ignore[arg-type]
    eager = memory_report(step, frozenset({"cross_entropy", "cross_entropy_grad"}))    # type: ignore[arg-type]
    ce = [n for n in step.nodes if n.op in ("cross_entropy", "cross_entropy_grad")]    # type: ignore[attr-defined]
    assert all(transient_bytes(n) == n.operands[0 if n.op == "cross_entropy" else 1].type.nbytes for n in ce)
    assert fused.peak <= eager.peak <= fused.peak + max(transient_bytes(n) for n in ce)
    assert memory_report(step, frozenset()).peak == fused.peak     # type: ignore[arg-type]
