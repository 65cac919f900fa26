"""ONNX's backend interface (``onnx.backend.base.Backend``) over partita.

This is what lets ONNX's own conformance suite (``onnx.backend.test.BackendTest``) run
against partita: a model is imported with ``import_onnx`` and executed by partita's NumPy
reference interpreter (``PartitaBackend``) or by its torch executor (``PartitaTorchBackend``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from onnx.backend.base import Backend, BackendRep

from ..ir.graph import Graph
from .onnx import OnnxImportError, constant_operand_inputs, import_onnx


class PartitaBackendRep(BackendRep):
    """An imported model, ready to run on a list (or dict by ONNX input name) of arrays."""

    def __init__(self, model: Any, executor: str) -> None:
        self.model = model
        inits = {t.name for t in model.graph.initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits]
        self.static_names = constant_operand_inputs(model)
        self.executor = executor
        self._graphs: dict[tuple, Graph] = {}
        if not self.static_names:
            # Nothing to specialize on: import now so errors surface at prepare time.
            self._graphs[()] = import_onnx(model)

    def graph_for(self, static: dict[str, np.ndarray]) -> Graph:
        """The graph specialized on the values of the inputs the importer needs as constants
        (a Reshape shape or Squeeze axes fed as a graph input), imported once per value."""
        key = tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(static.items()))
        if key not in self._graphs:
            self._graphs[key] = import_onnx(self.model, static_inputs=static)
        return self._graphs[key]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run the graph; returns NumPy arrays in the order of the ONNX graph outputs."""
        import partita

        if isinstance(inputs, dict):
            by_name = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            seq = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            by_name = dict(zip(self.input_names, (np.asarray(x) for x in seq)))
        static = {k: by_name[k] for k in self.static_names}
        graph = self.graph_for(static)
        outs = partita.run(graph, [by_name[k] for k in self.input_names if k not in static],
                           backend=self.executor)
        if self.executor == "torch":
            return tuple(_torch_to_numpy(o) for o in outs)
        return tuple(np.asarray(o) for o in outs)


def _torch_to_numpy(t: Any) -> np.ndarray:
    import ml_dtypes
    import torch

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
        return PartitaBackendRep(model, cls.executor)

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


def conformance(backend: type[PartitaBackend] = PartitaBackend) -> dict[str, list[tuple[str, str | None]]]:
    """Run ONNX's node test cases for every claimed op type through ``backend``.

    Returns op type -> [(case name, None if it passed else the first line of the error)],
    covering the cases whose model uses only op types in ``ONNX_TO_PARTITA`` (the
    "_expanded" function-body variants excluded: they test other ops).
    """
    from onnx.backend.test.case.node import collect_testcases
    from onnx.backend.test.runner import Runner

    from .onnx import ONNX_TO_PARTITA

    results: dict[str, list[tuple[str, str | None]]] = {}
    seen: set[str] = set()
    for tc in collect_testcases():
        if tc.model is None or "_expanded" in tc.name or tc.name in seen:
            continue
        ops = [n.op_type for n in tc.model.graph.node]
        if not ops or not all(op in ONNX_TO_PARTITA for op in ops):
            continue
        seen.add(tc.name)
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
        results.setdefault(ops[-1], []).append((tc.name, err))
    return results


def conformance_markdown(results: dict[str, list[tuple[str, str | None]]]) -> str:
    """The per-operator pass table (and each failure with its error) as Markdown."""
    lines = ["# ONNX node conformance", "",
             "Generated by `python -m partita.frontend.onnx_backend`: ONNX's own node test cases",
             "(onnx.backend.test.case.node) for the op types the importer claims, run through",
             "partita's ONNX backend on the NumPy reference interpreter.", "",
             "| op | passed | total |", "|---|---:|---:|"]
    tot_p = tot = 0
    for op in sorted(results):
        p = sum(err is None for _, err in results[op])
        tot_p, tot = tot_p + p, tot + len(results[op])
        lines.append(f"| {op} | {p} | {len(results[op])} |")
    lines += [f"| **all** | **{tot_p}** | **{tot}** |", "", "## Failures", ""]
    for op in sorted(results):
        for name, err in results[op]:
            if err is not None:
                lines.append(f"- `{name}` ({op}): {err[:200]}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    text = conformance_markdown(conformance())
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(text)
    else:
        print(text)
