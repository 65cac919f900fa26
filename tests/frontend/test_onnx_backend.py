"""ONNX's own node conformance tests (onnx.backend.test.BackendTest) run against partita.

The onnx wheel ships no files under onnx/backend/test/data/node; the runner generates the
node cases in memory from onnx.backend.test.case.node instead. We include exactly the cases
whose model uses only op types the importer claims (ONNX_TO_PARTITA) and which are not the
"_expanded" variants (those run a function body, testing other ops). Cases that fail are
listed in KNOWN_FAILURES with the reason next to each; the rest must pass.
"""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")

import re  # noqa: E402

import onnx.backend.test  # noqa: E402
import onnx.backend.test.case.node as _node_cases  # noqa: E402

from partita.frontend.onnx import ONNX_TO_PARTITA  # noqa: E402
from partita.frontend.onnx_backend import PartitaBackend, PartitaTorchBackend, conformance  # noqa: E402

# Claimed-op cases partita does not pass (regex over the case name -> reason). They are marked
# expected failures, so a case that starts passing fails the run until its line is removed.
KNOWN_FAILURES: dict[str, str] = {
    r"test_cast_.*(FLOAT8|FLOAT4|INT4|UINT4|INT2|UINT2|STRING)": "no partita dtype for 8/4/2-bit or string types",
    r"test_.*_(uint16|uint32|uint64)_cpu$": "no partita dtype for u16/u32/u64 (only u8)",
    r"test_cast_.*(UINT16|UINT32|UINT64)": "no partita dtype for u16/u32/u64 (only u8)",
    r"test_equal_string": "string tensors have no partita dtype",
    r"test_(average|max)pool_3d_": "3-D pooling: partita has 2-D pools (1-D ones are lifted to 2-D)",
    r"test_averagepool_2d_dilations_cpu$": "avg_pool2d has no dilation",
    r"test_maxpool_with_argmax_": "max_pool2d returns no Indices output",
    r"test_batchnorm_.*_training_mode_cpu$": "training-mode BatchNormalization (batch statistics outputs) is not imported",
    r"test_training_dropout": "training-mode Dropout (random mask) is not imported; inference only",
    r"test_identity_(sequence|opt)_cpu$": "sequence and optional types are not tensors; partita has tensors only",
    r"test_wrap_pad_cpu$": "Pad mode 'wrap' is not imported (constant, reflect and edge are)",
    r"test_slice_neg_steps_cpu$": "Slice with a negative step: partita's slice takes positive steps only",
}

backend_test = onnx.backend.test.BackendTest(PartitaBackend, __name__)


def claimed_cases() -> dict[str, str]:
    """Node case name -> the op type it tests, for cases using only claimed op types.

    The runner fills the generator module's case list while it is built; reading that list
    avoids generating every case a second time.
    """
    out: dict[str, str] = {}
    for tc in _node_cases._NodeTestCases:  # noqa: SLF001
        if tc.model is None or "_expanded" in tc.name:
            continue
        ops = [n.op_type for n in tc.model.graph.node]
        if ops and all(op in ONNX_TO_PARTITA for op in ops):
            out[tc.name] = ops[-1]
    return out


CASES = claimed_cases()
for _name in sorted(CASES):
    backend_test.include(f"^{_name}_cpu$")
for _pattern in KNOWN_FAILURES:
    backend_test.xfail(_pattern)

globals().update(backend_test.test_cases)


def test_torch_executor_passes_the_same_node_cases():
    """The torch executor passes every claimed case that is not a known failure, and the
    known failures fail there too (they are import-time gaps, not executor differences)."""
    results = conformance(PartitaTorchBackend)
    ran = {name for cases in results.values() for name, _ in cases}
    assert ran == set(CASES)
    for op, cases in results.items():
        for name, err in cases:
            known = any(re.search(p, f"{name}_cpu") for p in KNOWN_FAILURES)
            assert (err is None) != known, f"{name} ({op}) on torch: {err or 'passes but is listed as known failure'}"
