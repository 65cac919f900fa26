"""The zoo's fast subset (bench/bench_zoo.py, docs/zoo.md): correctness only, no timing.

A CNN with depthwise convolutions and BatchNorm, a ViT, a GQA decoder, an encoder and a speech
model with a convolutional feature extractor, each built from a small transformers config
with random weights: the torch.export import against eager, ``torch.compile(backend=
"partita")`` against eager with no graph left on ATen, and one training step with the model's
own loss equal to torch's (loss and every updated param), all within the zoo's 1e-4.
"""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import bench_zoo as zoo  # noqa: E402
from zoo_models import BY_NAME  # noqa: E402

# Each model takes seconds: its checks are in the slow tier.
slow = pytest.mark.slow

SUBSET = ["mobilenet_v2", "vit", "llama", "bert", "wav2vec2"]


@functools.cache
def case(name: str) -> zoo.Case:
    """The model built once for all its checks."""
    return zoo.Case(BY_NAME[name], Path(tempfile.mkdtemp(prefix="zoo-test-")))


@slow
@pytest.mark.parametrize("name", SUBSET)
def test_export_import_matches_eager(name: str) -> None:
    cell = zoo.col_export(case(name))
    assert cell.ok, f"{name}: {cell.text}"


@slow
@pytest.mark.parametrize("name", SUBSET)
def test_partita_backend_matches_eager_without_fallback(name: str) -> None:
    cell = zoo.col_infer(case(name))
    assert cell.ok, f"{name}: {cell.text}"


@slow
@pytest.mark.parametrize("name", SUBSET)
def test_one_training_step_equals_torch(name: str) -> None:
    cell = zoo.col_train(case(name))
    assert cell.ok, f"{name}: {cell.text}"


def test_the_zoo_covers_every_family_with_at_least_42_models() -> None:
    from zoo_models import FAMILIES, MODELS

    assert len(MODELS) >= 42
    assert {m.family for m in MODELS} == set(FAMILIES)
    assert len(BY_NAME) == len(MODELS), "model names are unique"


def test_a_failing_column_is_a_cell_not_a_crash() -> None:
    def boom() -> None:
        raise RuntimeError("no such model\nsecond line")

    broken = zoo.ZooModel("broken", "cnn", boom, dict)  # type: ignore[arg-type]
    row = zoo.run_model(broken, ["export", "train"], Path(tempfile.mkdtemp()), [1], 3, 30.0, 60.0)
    assert all(c.ok is False and "no such model" in c.text and "second" not in c.text for c in row.cells.values())
    assert "**fail**" in zoo.correctness_table([row], ["export", "train"])


@slow
def test_a_strategy_that_does_not_apply_is_not_counted() -> None:
    c = case("mobilenet_v2")
    cell = zoo.col_strategy(c, "megatron+sp")
    assert cell.ok is None and cell.text.startswith("n/a: ")
    assert zoo.col_strategy(c, "ep").text == "n/a: no experts"
    row = zoo.Row("m", "cnn", "", {"megatron+sp": cell})
    assert zoo.pass_counts([row], ["megatron+sp"]) == {"megatron+sp": (0, 0)}
