"""ONNX's own node conformance tests (onnx.backend.test.BackendTest) run against partita.

The onnx wheel ships no files under onnx/backend/test/data/node; the runner generates the
node cases in memory from onnx.backend.test.case.node instead. We include exactly the cases
whose model uses only op types the importer claims (ONNX_TO_PARTITA), the "_expanded"
variants (an op's function body spelled out in other ops, as onnxscript writes them)
included; the runner's other cases are left out of the collection rather than skipped. Cases that fail are
listed in KNOWN_FAILURES with the reason next to each; the rest must pass.
"""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")

import re  # noqa: E402

import numpy as np  # noqa: E402

import onnx.backend.test  # noqa: E402
import onnx.backend.test.case.node as _node_cases  # noqa: E402

from partita.frontend.onnx.backend import (  # noqa: E402
    OUT_OF_SCOPE, PartitaBackend, PartitaTorchBackend, claimed_node_cases, conformance, correct_to_spec)

# Cases of claimed op types outside what partita claims (strings, sequences, another library's
# random stream), with the reason next to each, shared with the conformance report. They are
# strict expected failures: one that starts passing fails the run until its line is removed.
KNOWN_FAILURES: dict[str, str] = OUT_OF_SCOPE

backend_test = onnx.backend.test.BackendTest(PartitaBackend, __name__)


def claimed_cases() -> dict[str, str]:
    """Node case name -> the op type it tests, for cases using only claimed op types (the
    "_expanded" function bodies included; see claimed_node_cases).

    The runner fills the generator module's case list while it is built; reading that list
    avoids generating every case a second time.
    """
    return {name: op for name, (op, _) in claimed_node_cases(_node_cases._NodeTestCases).items()}  # noqa: SLF001


CASES = claimed_cases()
# Cases whose generated expected outputs contradict the ONNX specification (SPEC_CORRECTED in
# partita.frontend.onnx.backend, with the reasons) are compared with the specification's values.
CORRECTED = correct_to_spec(_node_cases._NodeTestCases)  # noqa: SLF001
for _pattern in KNOWN_FAILURES:
    backend_test.xfail(_pattern)


def claimed_test_classes() -> dict[str, type]:
    """The runner's test classes holding only the claimed cases on the CPU.

    ONNX's runner turns every case it does not include into a skipped test (thousands of
    them: op types partita does not claim, and every case again for a CUDA device). Those are
    not partita's tests, so they are left out of the collection instead of skipped; what the
    summary line counts as skipped is then only what partita itself skips, with its reason.
    """
    wanted = {f"{name}_cpu" for name in CASES}
    out: dict[str, type] = {}
    for class_name, cls in backend_test.test_cases.items():
        names = [n for n in vars(cls) if n.startswith("test_")]
        for n in names:
            if n not in wanted:
                delattr(cls, n)
        if any(n in wanted for n in names):
            out[class_name] = cls
    return out


globals().update(claimed_test_classes())


def test_torch_executor_passes_the_same_node_cases():
    """The torch executor passes every claimed case that is not a known failure, and the
    known failures fail there too (they are import-time gaps, not executor differences)."""
    results = conformance(PartitaTorchBackend)
    ran = {name for cases in results.values() for name, _ in cases}
    assert ran == set(CASES)
    assert CORRECTED and set(CORRECTED) <= ran
    for op, cases in results.items():
        for name, err in cases:
            known = any(re.search(p, f"{name}_cpu") for p in KNOWN_FAILURES)
            assert (err is None) != known, f"{name} ({op}) on torch: {err or 'passes but is listed as known failure'}"


def test_corrected_cases_expect_the_specification_values():
    """The corrected Cast cases expect what ONNX's notes state: INT4 saturates (the case's
    inputs are -9..15), UINT2 too, and NaN to FLOAT4E2M1 is 6."""
    by_name = {tc.name: tc for tc in _node_cases._NodeTestCases}  # noqa: SLF001
    (_, (int4,)), = by_name["test_cast_FLOAT_to_INT4"].data_sets
    assert int4.astype(int).ravel().tolist() == [-8, -8] + list(range(-7, 8)) + [7] * 8
    (_, (uint2,)), = by_name["test_cast_FLOAT_to_UINT2"].data_sets
    assert uint2.astype(int).ravel().tolist() == [0, 0, 0, 0, 1, 2, 3]
    (inputs, (f4,)), = by_name["test_cast_FLOAT_to_FLOAT4E2M1"].data_sets
    x = onnx.numpy_helper.to_array(inputs[0]) if isinstance(inputs[0], onnx.TensorProto) else inputs[0]
    f4 = f4.astype(float).ravel()
    assert f4[np.isnan(x.ravel())].tolist() == [6.0]
    assert f4[np.isinf(x.ravel())].tolist() == [6.0, 6.0, -6.0]
