"""The training-step benchmark stays runnable and times what it says: both steps train the
same model from the same weights on the same batch, so their losses agree round by round."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def bench_train():
    sys.path.insert(0, str(BENCH))
    try:
        import bench_train
    finally:
        sys.path.remove(str(BENCH))
    return bench_train


def test_partita_and_eager_steps_compute_the_same_losses(bench_train) -> None:
    import numpy as np
    import torch

    import partita
    from partita.autodiff import Trainer

    _, model, x, y = bench_train.make("mlp")
    model.eval()
    fwd = partita.import_torch(model, (x,))
    trainer = Trainer(partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", lr=1e-3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(3):
        ours = trainer.step({"x": x, "target": y})
        opt.zero_grad()
        loss = bench_train.eager_loss(model, x, y)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(ours, loss.item(), rtol=1e-5)


def test_the_benchmark_runs_and_reports_a_ratio(bench_train) -> None:
    r = bench_train.bench_step("mlp", rounds=2, warmup=1)
    assert r["nodes"] > 0 and len(r["partita_runs_ms"]) == len(r["eager_runs_ms"]) == 2
    assert r["ratio"] > 0
