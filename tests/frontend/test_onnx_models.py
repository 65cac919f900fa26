"""ONNX's model tests shipped in the onnx wheel, run against partita's torch executor.

The onnx wheel ships four sets of model tests under onnx/backend/test/data: "light"
(full-size CNNs whose weights are ConstantOfShape fills; the runner feeds a deterministic
ramp input and compares with the shipped *_output_0.pb), "pytorch-converted",
"pytorch-operator" and "simple" (each a model.onnx with test_data_set_* input/output .pb
files). Most are older than opset 13; the backend upgrades them with ONNX's version
converter. The torch executor runs them: the NumPy reference is too slow for the CNNs.
Every model that fails is listed in KNOWN_FAILURES with its reason, as a strict expected
failure, so a fix shows up as an unexpected pass.
"""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")

import onnx.backend.test  # noqa: E402

import re  # noqa: E402

from partita.frontend.onnx.backend import (  # noqa: E402
    MODEL_KINDS,
    PartitaTorchBackend,
    model_conformance,
    model_conformance_markdown,
)

# The four model-test sets and the test-class names the runner files them under. None is
# skipped: all of them together take about 40 s on one core, most of it the light CNNs.
MODEL_SETS = {"light": "RealModel", "pytorch-converted": "PyTorchConvertedModel",
              "pytorch-operator": "PyTorchOperatorModel", "simple": "SimpleModel"}

# Model test name (regex, anchored by the runner's "_cpu" suffix) -> why it fails.
KNOWN_FAILURES: dict[str, str] = {
    # pytorch-converted
    # pytorch-operator
    # simple
    r"^test_gradient_of_add": "ai.onnx.preview.training::Gradient is a training op; the importer is inference only",
    r"^test_strnorm_model_": "StringNormalizer works on string tensors, which have no partita dtype",
}

backend_test = onnx.backend.test.BackendTest(PartitaTorchBackend, __name__)
backend_test.include(r"^test_.*_cpu$")
for _pattern in KNOWN_FAILURES:
    backend_test.xfail(_pattern)



def cpu_test_classes() -> dict[str, type]:
    """The runner's classes of the four model sets, holding only their CPU tests: it makes
    each test again for a CUDA device and skips it (partita's backend runs on the CPU here),
    so those are left out of the collection instead of counted as skips."""
    out: dict[str, type] = {}
    for name, case in backend_test.test_cases.items():
        if name.removeprefix("OnnxBackend").removesuffix("Test") not in MODEL_SETS.values():
            continue
        for attr in [a for a in vars(case) if a.startswith("test_") and not a.endswith("_cpu")]:
            delattr(case, attr)
        out[name] = case
    return out


globals().update(cpu_test_classes())


@pytest.fixture(autouse=True)
def _onnx_home(tmp_path, monkeypatch):
    """The runner writes the light models' generated inputs under $ONNX_HOME; keep that
    out of the user's home directory."""
    monkeypatch.setenv("ONNX_HOME", str(tmp_path))


def test_conformance_report_agrees_with_known_failures():
    """The report generator (docs/onnx-conformance.md) sees the same pass/fail split as the
    runner for the small sets; the light CNNs are left to the runner's tests above for time."""
    sets = ["pytorch-operator", "simple"]
    results = model_conformance(PartitaTorchBackend, sets=sets)
    assert list(results) == sets and all(results.values())
    for kind, cases in results.items():
        for name, err in cases:
            known = any(re.search(p, f"{name}_cpu") for p in KNOWN_FAILURES)
            assert (err is None) != known, f"{kind}/{name}: {err or 'passes but is listed as a known failure'}"
    text = model_conformance_markdown(results)
    for kind, cases in results.items():
        assert kind in MODEL_KINDS and f"### {kind}" in text
        assert f"| {kind} | {sum(e is None for _, e in cases)} | {len(cases)} |" in text


def test_backend_upgrades_old_opsets_only():
    """An opset 9 model is converted to opset 13 before import (its BatchNormalization and
    Softmax change meaning on the way); an opset 13+ model is passed through unchanged."""
    import numpy as np
    from onnx import TensorProto, helper

    from partita.frontend.onnx.backend import upgrade_opset

    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])])
    old = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    new = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert upgrade_opset(new) is new
    assert [i.version for i in upgrade_opset(old).opset_import if i.domain == ""] == [13]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    # Opset < 13 Softmax normalizes over the flattened trailing axes [1:], not axis 1 alone.
    flat = x.reshape(2, 12)
    want = (np.exp(flat) / np.exp(flat).sum(1, keepdims=True)).reshape(2, 3, 4)
    (got,) = PartitaTorchBackend.run_model(old, [x])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
