"""ONNX's backend interface (``onnx.backend.base.Backend``) over partita.

This is what lets ONNX's own conformance suite (``onnx.backend.test.BackendTest``) run
against partita: a model is imported with ``import_onnx`` and executed by partita's NumPy
reference interpreter (``PartitaBackend``) or by its torch executor (``PartitaTorchBackend``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from onnx.backend.base import Backend, BackendRep

from ...ir.graph import Graph
from .common import OnnxImportError
from .importer import constant_operand_inputs, import_onnx, known_shape_and_type


class PartitaBackendRep(BackendRep):
    """An imported model, ready to run on a list (or dict by ONNX input name) of arrays."""

    def __init__(self, model: Any, executor: str) -> None:
        self.model = model
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        self.static_names = constant_operand_inputs(model)
        # Inputs with a symbolic or missing shape take the shape of the array they are given.
        self.shaped_names = [vi.name for vi in model.graph.input if vi.name in self.input_names
                             and vi.type.HasField("tensor_type") and known_shape_and_type(vi)[0] is None]
        self.executor = executor
        self._graphs: dict[tuple, Graph] = {}
        if not self.static_names and not self.shaped_names:
            # Nothing to specialize on: import now so errors surface at prepare time.
            self._graphs[()] = import_onnx(model)

    def graph_for(self, static: dict[str, np.ndarray],
                  shapes: dict[str, Sequence[int]] | None = None) -> Graph:
        """The graph specialized on the values of the inputs the importer needs as constants
        (a Reshape shape or Squeeze axes fed as a graph input) and on the shapes of inputs
        declared with symbolic dims, imported once per value."""
        shapes = shapes or {}
        key = (tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(static.items()))
               + tuple((k, tuple(s)) for k, s in sorted(shapes.items())))
        if key not in self._graphs:
            self._graphs[key] = import_onnx(self.model, input_shapes=shapes, static_inputs=static)
        return self._graphs[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run the graph; returns NumPy arrays in the order of the ONNX graph outputs."""
        if self.executor == "torch":
            from ...backend.torch_exec import run as run_graph
        else:
            from ...backend.numpy_ref import run as run_graph

        if isinstance(inputs, dict):
            by_name = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            seq = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            by_name = dict(zip(self.input_names, (np.asarray(x) for x in seq)))
        static = {k: by_name[k] for k in self.static_names}
        graph = self.graph_for(static, {k: by_name[k].shape for k in self.shaped_names if k not in static})
        outs = run_graph(graph, [by_name[k] for k in self.input_names if k not in static])
        if self.executor == "torch":
            return tuple(_torch_to_numpy(o) for o in outs)
        return tuple(np.asarray(o) for o in outs)


def upgrade_opset(model: Any) -> Any:
    """``model`` converted to opset MIN_OPSET if it imports an older default-domain opset.

    import_onnx upgrades such a model itself, with a warning; the backend upgrades once at
    prepare time, quietly, so that each specialization (one import per static-input value
    or input shape) does not convert the model again.
    """
    import warnings

    from .importer import MIN_OPSET, OnnxOpsetUpgradeWarning, convert_to_min_opset, opset_of

    version = opset_of(model, "<onnx>")
    if version >= MIN_OPSET:
        return model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OnnxOpsetUpgradeWarning)
        return convert_to_min_opset(model, "<onnx>", version)


def _torch_to_numpy(t: Any) -> np.ndarray:
    import ml_dtypes
    import torch

    if isinstance(t, np.ndarray):  # the torch executor returns storage-typed results as NumPy
        return t
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16; ml_dtypes' is partita's bf16
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return np.asarray(t.numpy())


class PartitaBackend(Backend):
    """ONNX backend running partita's NumPy reference interpreter on the CPU."""

    executor = "numpy"

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> PartitaBackendRep:
        """Import ``model`` (a ModelProto) into a partita graph bound to this executor."""
        if not cls.supports_device(device):
            raise OnnxImportError(f"partita's ONNX backend runs on CPU, not '{device}'")
        return PartitaBackendRep(upgrade_opset(model), cls.executor)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Import and run ``model`` once."""
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: Any, inputs: Any, device: str = "CPU", outputs_info: Sequence[Any] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run a single NodeProto on ``inputs`` by wrapping it in a one-node model."""
        from onnx import helper

        arrays = [np.asarray(x) for x in inputs]
        in_vis = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                  for name, a in zip(node.input, arrays)]
        out_vis = [helper.make_empty_tensor_value_info(name) for name in node.output]
        graph = helper.make_graph([node], "node", in_vis, out_vis)
        opset = int(kwargs.get("opset_version", helper.VERSION_TABLE[-1][2]))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        return cls.run_model(model, arrays, device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Only the CPU: both executors run there (torch's executor could use CUDA, but the
        conformance suite's device strings are ONNX's, checked here)."""
        return device.upper() == "CPU"


class PartitaTorchBackend(PartitaBackend):
    """ONNX backend running partita's torch executor."""

    executor = "torch"


def _as_array(x: Any) -> Any:
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(x) if isinstance(x, TensorProto) else x


def claimed_node_cases(cases: Sequence[Any]) -> dict[str, tuple[str, Any]]:
    """Node case name -> (the op type it tests, the case), for the cases whose model uses
    only op types in ``ONNX_TO_PARTITA``. The "_expanded" variants (an op's function body,
    as onnxscript writes it, spelled out in other ops) are included when their ops are all
    claimed, filed under the op their base case tests (or, without one, the body's last op)."""
    from .registry import ONNX_TO_PARTITA

    plain: dict[str, str] = {}
    for tc in cases:
        if tc.model is not None and "_expanded" not in tc.name and tc.model.graph.node:
            plain.setdefault(tc.name, tc.model.graph.node[-1].op_type)
    out: dict[str, tuple[str, Any]] = {}
    for tc in cases:
        if tc.model is None or tc.name in out:
            continue
        ops = [n.op_type for n in tc.model.graph.node]
        if not ops or not all(op in ONNX_TO_PARTITA for op in ops):
            continue
        op = plain.get(tc.name.split("_expanded")[0], ops[-1]) if "_expanded" in tc.name else ops[-1]
        out[tc.name] = (op, tc)
    return out


def conformance(backend: type[PartitaBackend] = PartitaBackend) -> dict[str, list[tuple[str, str | None]]]:
    """Run ONNX's node test cases for every claimed op type through ``backend``.

    Returns op type -> [(case name, None if it passed else the first line of the error)],
    covering ``claimed_node_cases`` (the "_expanded" function bodies whose ops are all
    claimed included). The cases of SPEC_CORRECTED are compared with the specification's
    values (``correct_to_spec``).
    """
    from onnx.backend.test.case.node import collect_testcases
    from onnx.backend.test.runner import Runner

    results: dict[str, list[tuple[str, str | None]]] = {}
    cases = collect_testcases()
    correct_to_spec(cases)
    for name, (op, tc) in claimed_node_cases(cases).items():
        err: str | None = None
        try:
            rep = backend.prepare(tc.model)
            for inputs, expected in tc.data_sets or []:
                # Case data may hold TensorProtos; the runner converts them the same way.
                ins = [_as_array(x) for x in inputs]
                got = rep.run(ins)
                Runner.assert_similar_outputs([_as_array(x) for x in expected], list(got), rtol=tc.rtol,
                                              atol=tc.atol)
        except Exception as e:  # a conformance report records every kind of failure
            err = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        results.setdefault(op, []).append((name, err))
    return results


# The model-test sets shipped in the onnx wheel (onnx/backend/test/data/<set>) -> the kind
# onnx.backend.test.loader files them under ("light" models load as kind "real").
MODEL_KINDS = {"light": "real", "pytorch-converted": "pytorch-converted",
               "pytorch-operator": "pytorch-operator", "simple": "simple"}


def _model_inputs_outputs(tc: Any, model: Any) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """The (inputs, expected outputs) data sets of one model test, loaded the way
    onnx.backend.test.runner loads them (a light model gets the runner's ramp input)."""
    import glob
    import os

    from onnx import numpy_helper
    from onnx.backend.test.runner import Runner

    def load(path: str) -> np.ndarray:
        t = onnx_module().TensorProto()
        t.ParseFromString(open(path, "rb").read())
        return numpy_helper.to_array(t)

    if tc.model_dir is None:  # a light model: <name>.onnx next to <name>_output_<i>.pb
        prefix = os.path.splitext(_light_path(tc))[0]
        inits = {t.name for t in model.graph.initializer}
        ins = [Runner.generate_dummy_data(vi, seed=0, name=tc.model_name, random=False)
               for vi in model.graph.input if vi.name not in inits]
        outs = [load(f"{prefix}_output_{i}.pb") for i in range(len(model.graph.output))]
        return [(ins, outs)]
    sets = []
    for d in sorted(glob.glob(os.path.join(tc.model_dir, "test_data_set*"))):
        n_in = len(glob.glob(os.path.join(d, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(d, "output_*.pb")))
        sets.append(([load(os.path.join(d, f"input_{i}.pb")) for i in range(n_in)],
                     [load(os.path.join(d, f"output_{i}.pb")) for i in range(n_out)]))
    return sets


def onnx_module() -> Any:
    """The onnx package (imported lazily: partita itself does not need it)."""
    import onnx

    return onnx


def _light_path(tc: Any) -> str:
    import os

    import onnx.backend.test.runner as runner

    return os.path.normpath(os.path.join(os.path.dirname(runner.__file__), "..", "..", "..", "..", tc.url))


def model_conformance(backend: type[PartitaBackend] = PartitaTorchBackend,
                      sets: Sequence[str] = tuple(MODEL_KINDS)) -> dict[str, list[tuple[str, str | None]]]:
    """Run the model tests shipped in the onnx wheel (``sets`` of onnx/backend/test/data)
    through ``backend``: set -> [(test name, None if it passed else the first error line)]."""
    import os

    from onnx.backend.test.loader import load_model_tests
    from onnx.backend.test.runner import Runner

    results: dict[str, list[tuple[str, str | None]]] = {}
    for kind in sets:
        for tc in sorted(load_model_tests(kind=MODEL_KINDS[kind]), key=lambda t: t.name):
            err: str | None = None
            try:
                path = _light_path(tc) if tc.model_dir is None else os.path.join(tc.model_dir, "model.onnx")
                model = onnx_module().load(path)
                rep = backend.prepare(model)
                for inputs, expected in _model_inputs_outputs(tc, model):
                    Runner.assert_similar_outputs(expected, list(rep.run(inputs)), rtol=tc.rtol, atol=tc.atol)
            except Exception as e:  # a conformance report records every kind of failure
                err = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            results.setdefault(kind, []).append((tc.name, err))
    return results


# Node cases of claimed op types that test something outside what partita claims for the op:
# element types that are not tensors of numbers, or a result defined by another library's
# random stream. Regex over the case name -> reason. The test suite marks them strict
# expected failures, so one that starts passing must be taken out of this table.
OUT_OF_SCOPE: dict[str, str] = {
    r"test_attention_4d_causal_fp16_expanded(_cpu)?$":
        "the function body run op by op in float16 rounds every intermediate (the scaled scores, the "
        "bias, the softmax) to float16; the expected outputs come from the whole op's reference, and 2 "
        "of 192 elements differ by 2 float16 ulps, 1.2e-3 relative against the case's rtol of 1e-3 "
        "(the Attention case itself, without _expanded, passes)",
    r"test_cast_.*STRING": "string tensors: partita's tensors hold numbers and bools only",
    r"test_equal_string": "string tensors: partita's tensors hold numbers and bools only",
    r"test_training_dropout(_default|_default_mask|_mask)?(_cpu)?$":
        "training Dropout with ratio > 0: the expected output is the mask NumPy's global generator drew, "
        "which no other generator reproduces; partita's mask is a counter-based hash of the seed, and its "
        "properties (scale, mask = nonzeros, dropped share, determinism) are tested in tests/frontend/test_onnx.py",
    r"test_identity_(sequence|opt)(_cpu)?$": "sequence and optional values: partita's values are tensors only",
    r"test_(sequence_insert_at_(back|front)|split_to_sequence_(1|2|nokeepdims))(_cpu)?$":
        "sequence-typed graph inputs/outputs: partita's values are tensors",
}


# Node cases whose expected outputs contradict the ONNX specification of the onnx version
# partita locks (1.23.2), regex over the case name -> reason. The generator computes them
# with ml_dtypes' conversions, which do not follow the specification here; partita follows
# the specification, so ``correct_to_spec`` replaces these expected outputs with the
# specification's values (computed from each case's inputs by ``spec_cast_narrow``).
SPEC_CORRECTED: dict[str, str] = {
    r"^test_cast(like)?_(FLOAT|FLOAT16)_to_(U?INT4|U?INT2)(_expanded)?$":
        "ONNX's 4-bit and 2-bit integer notes: a cast to INT4/UINT4/INT2/UINT2 rounds to the nearest "
        "integer (ties to even) and saturates to the range; the generated outputs truncate toward zero "
        "and give 0 for values out of range (-9 -> 0 for INT4, where the specification gives -8)",
    r"^test_cast(like)?_(FLOAT|FLOAT16)_to_FLOAT4E2M1(_expanded)?$":
        "ONNX's float4 note: a cast to FLOAT4E2M1 gives 6 for NaN; the generated outputs give 0",
}

_NARROW_RANGES = {"INT4": (-8, 7), "UINT4": (0, 15), "INT2": (-2, 1), "UINT2": (0, 3)}


def spec_cast_narrow(x: np.ndarray, to: str) -> np.ndarray:
    """Float ``x`` cast to ONNX type ``to`` (INT4, UINT4, INT2, UINT2 or FLOAT4E2M1) by the
    rules the ONNX specification states in its technical notes (int4.md, int2.md, float4.md):
    integers round to nearest, ties to even, and saturate to the range; FLOAT4E2M1 rounds to
    nearest even, saturates to +-6 (infinities too) and gives 6 for NaN. A NaN cast to an
    integer is undefined there; this gives 0, partita's choice (docs/ir.md)."""
    import ml_dtypes

    x = np.asarray(x).astype(np.float64)
    if to == "FLOAT4E2M1":
        return np.where(np.isnan(x), 6.0, np.clip(x, -6.0, 6.0)).astype(ml_dtypes.float4_e2m1fn)
    lo, hi = _NARROW_RANGES[to]
    ints = np.clip(np.where(np.isnan(x), 0.0, np.rint(x)), lo, hi).astype(np.int64)
    return ints.astype(getattr(ml_dtypes, to.lower()))


def correct_to_spec(cases: Sequence[Any]) -> list[str]:
    """Replace, in place, the expected outputs of the node cases listed in SPEC_CORRECTED
    with the specification's values; returns the names of the cases changed. Idempotent:
    the values are computed from the inputs, which are left alone."""
    import re

    from onnx import helper

    changed = []
    for tc in cases:
        if not any(re.search(p, tc.name) for p in SPEC_CORRECTED) or not tc.data_sets:
            continue
        node = tc.model.graph.node[0]
        # Cast names the target in its 'to' attribute, CastLike (and its expanded body) by the
        # dtype of its second input.
        code = (tc.model.graph.input[1].type.tensor_type.elem_type if tc.name.startswith("test_castlike") else
                helper.get_attribute_value(next(a for a in node.attribute if a.name == "to")))
        to = helper.tensor_dtype_to_string(code).removeprefix("TensorProto.")
        for k, (inputs, _) in enumerate(tc.data_sets):
            tc.data_sets[k] = (inputs, [spec_cast_narrow(_as_array(inputs[0]), to)])
        changed.append(tc.name)
    return changed


def out_of_scope(name: str) -> str | None:
    """The reason a node case is outside partita's claims, or None."""
    import re

    for pattern, why in OUT_OF_SCOPE.items():
        if re.search(pattern, name):
            return why
    return None


def conformance_markdown(results: dict[str, list[tuple[str, str | None]]]) -> str:
    """The per-operator pass table (and each failure with its error) as Markdown."""
    lines = ["# ONNX node conformance", "",
             "Generated by `python -m partita.frontend.onnx.backend`: ONNX's own node test cases",
             "(onnx.backend.test.case.node) for the op types the importer claims, run through",
             "partita's ONNX backend on the NumPy reference interpreter (the test suite runs them",
             "on the torch executor too). A few cases of claimed op types test values partita",
             "does not claim (strings, sequences, another library's random stream); they are",
             "counted apart, with the reason listed below.", "",
             "| op | passed | claimed cases | out of scope |", "|---|---:|---:|---:|"]
    tot_p = tot = tot_x = 0
    for op in sorted(results):
        cases = [(n, e) for n, e in results[op] if out_of_scope(n) is None]
        x = len(results[op]) - len(cases)
        p = sum(err is None for _, err in cases)
        tot_p, tot, tot_x = tot_p + p, tot + len(cases), tot_x + x
        lines.append(f"| {op} | {p} | {len(cases)} | {x or ''} |")
    lines += [f"| **all** | **{tot_p}** | **{tot}** | **{tot_x}** |", "", "## Failures of claimed cases", ""]
    failures = [f"- `{name}` ({op}): {err[:200]}" for op in sorted(results) for name, err in results[op]
                if err is not None and out_of_scope(name) is None]
    lines += failures or ["None: every claimed case passes."]
    lines += ["", "## Expected outputs corrected to the specification", ""]
    lines += [f"- `{pattern}`: {why}" for pattern, why in SPEC_CORRECTED.items()]
    lines += ["", "## Out of scope", ""]
    for op in sorted(results):
        for name, err in results[op]:
            why = out_of_scope(name)
            if why is not None:
                lines.append(f"- `{name}` ({op}, {'passes' if err is None else 'fails'}): {why}")
    return "\n".join(lines) + "\n"


def model_conformance_markdown(results: dict[str, list[tuple[str, str | None]]]) -> str:
    """Per-set pass counts and a per-model table (passed, or the failure) as Markdown."""
    lines = ["## ONNX model tests", "",
             "The model tests shipped in the onnx wheel (onnx/backend/test/data/<set>), run through",
             "partita's ONNX backend on the torch executor. Models older than opset 13 are upgraded",
             "with ONNX's version converter first; light models get the runner's ramp input and are",
             "compared with their shipped outputs.", "",
             "| set | passed | total |", "|---|---:|---:|"]
    for kind, cases in results.items():
        lines.append(f"| {kind} | {sum(e is None for _, e in cases)} | {len(cases)} |")
    for kind, cases in results.items():
        lines += ["", f"### {kind}", "", "| model | result |", "|---|---|"]
        for name, err in cases:
            res = "passed" if err is None else "failed: " + err[:200].replace("|", "\\|")
            lines.append(f"| `{name}` | {res} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    text = conformance_markdown(conformance()) + "\n" + model_conformance_markdown(model_conformance())
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(text)
    else:
        print(text)
