"""Step chains off and on (codegen/step_chain.py) in one process, beside ONNX Runtime.

For each zoo model: the import path's program twice (``import_torch``, bench_zoo's
IMPORT_PIPELINE, ``CompiledProgram(freeze=True)``), one with its chains left out and one with
them, and ORT on bench_zoo's export; both programs checked against eager after 20 warm-up calls
(the chains armed by then); then ``--blocks`` rounds of a block of ``--calls`` single calls of
each in turn. Printed: the medians of the block medians (us a call) and the medians of the
per-round ratios on / off, off / ORT and on / ORT, and how many steps are chained.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/step_chain_ab.py mobilenet_v2,resnet [--calls 200] [--blocks 8]
"""
from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_model_world as mw  # noqa: E402
import bench_zoo as Z  # noqa: E402
import zoo_calls as zc  # noqa: E402


def measure(name: str, calls: int, blocks: int) -> str:
    import partita
    from partita.codegen import CompiledProgram

    case = zc.zoo_case(name, "step_chain_ab")
    with Z.quiet():
        g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    off = CompiledProgram(g, freeze=True)
    off._chain_tries = 0   # never chained
    on = CompiledProgram(g, freeze=True)
    cands = {"off": lambda: off(args, weights), "on": lambda: on(args, weights), "ort": Z.ort_session(case, 1)}
    want = case.eager().double().numpy()
    res: dict[str, list[float]] = {k: [] for k in cands}
    with torch.inference_mode():
        for f in cands.values():
            for _ in range(20):
                f()
        for k in ("off", "on"):
            err = mw.rel_error(np.asarray(cands[k]()[0]), want)
            if err > Z.TOL:
                raise AssertionError(f"{name}: chains {k}: error {err:.1e} > {Z.TOL:.0e}")
        for _ in range(blocks):
            for k, f in cands.items():
                res[k].append(zc.block_median(f, calls))

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(res[a], res[b]))

    med = {k: statistics.median(v) for k, v in res.items()}
    return (f"{name}: off {med['off']:.1f} on {med['on']:.1f} ORT {med['ort']:.1f} us; on/off {ratio('on', 'off'):.3f}; "
            f"off/ORT {ratio('off', 'ort'):.3f} on/ORT {ratio('on', 'ort'):.3f}; "
            f"chained {on.chained_steps} of {len(on.program.steps)} steps")


def main(argv: list[str] | None = None) -> int:
    return zc.models_main(argv, __doc__ or "", measure, calls=200, blocks=8)


if __name__ == "__main__":
    raise SystemExit(main())
