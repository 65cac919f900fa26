"""The zoo's ConvNeXt v1 and v2 (bench/zoo_models.py: depthwise 7 x 7, channels-last LayerNorm,
layer scale, GRN) through the torch.export import and the torch.compile backend against eager,
within the zoo's 1e-4 (bench_zoo's correctness columns); v2's GRN becomes one ``grn`` node."""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_zoo as zoo  # noqa: E402
from zoo_models import BY_NAME  # noqa: E402

MODELS = ["convnext", "convnext_v2"]


@functools.cache
def case(name: str) -> zoo.Case:
    """The model built once for its checks."""
    return zoo.Case(BY_NAME[name], Path(tempfile.mkdtemp(prefix="convnext-test-")))


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_the_import_path_matches_eager(name: str) -> None:
    cell = zoo.col_export(case(name))
    assert cell.ok, f"{name}: {cell.text}"


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_the_backend_matches_eager_without_fallback(name: str) -> None:
    cell = zoo.col_infer(case(name))
    assert cell.ok, f"{name}: {cell.text}"


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_the_compiled_import_path_matches_eager(name: str) -> None:
    """bench_zoo's import path: IMPORT_PIPELINE, then CompiledProgram(freeze=True); v2's GRN is
    one node and v1's patch convolutions stay convolutions (4 x 4 and 2 x 2 patches)."""
    import numpy as np
    import torch

    import partita
    from partita.codegen import CompiledProgram

    c = case(name)
    with zoo.quiet():
        g = partita.optimize(partita.import_torch(c.model, (), c.kwargs), zoo.IMPORT_PIPELINE)
    ops = [n.op for n in g.nodes]
    assert ops.count("grn") == (2 if name == "convnext_v2" else 0) and "sqrt" not in ops
    assert ops.count("conv2d_pointwise") == 4 and "linear_pointwise" in ops
    prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [c.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    with torch.inference_mode():
        for _ in range(2):
            got = prog(args, weights)[0]
    want = c.eager()
    err = zoo.mw.rel_error(got.numpy(), want.double().numpy())
    assert err <= 1e-4, f"{name}: {err}"
