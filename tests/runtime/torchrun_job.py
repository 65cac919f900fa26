"""Run by tests/runtime/test_launch.py under ``python -m torch.distributed.run``: loads a
per-rank program and each rank's arrays from a folder, runs ``run_ranks`` (which joins
torchrun's process group) and saves what this rank got.

Usage: torchrun_job.py FOLDER STEPS TIMEOUT_S [FAULT]
FAULT is run_ranks' ``_fault`` as RANK,STEP,KIND (e.g. 0,1,raise).
FOLDER holds program.pir, mesh.txt, weights_<rank>.npz, inputs_<rank>.npz; the rank writes
result_<rank>.npz (out_<step>_<i>, w_<name>, filled) or error_<rank>.txt.
"""

import os
import sys

import numpy as np

import partita
from partita.runtime import RankFailure, run_ranks


def main() -> None:
    folder, steps, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    fault = None
    if len(sys.argv) > 4:
        r, s, kind = sys.argv[4].split(",")
        fault = (int(r), int(s), kind)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with open(os.path.join(folder, "program.pir")) as f:
        graph = partita.parse(f.read())
    with open(os.path.join(folder, "mesh.txt")) as f:
        mesh = f.read().strip()
    # A process holds only its own shards: the other ranks' entries are None.
    weights = [dict(np.load(os.path.join(folder, f"weights_{r}.npz"))) if r == rank else None for r in range(world)]
    inputs = [dict(np.load(os.path.join(folder, f"inputs_{r}.npz"))) if r == rank else None for r in range(world)]
    try:
        res = run_ranks(graph, mesh, weights, inputs, steps=steps, timeout_s=timeout_s, _fault=fault)
    except RankFailure as e:
        with open(os.path.join(folder, f"error_{rank}.txt"), "w") as f:
            f.write(str(e))
        raise
    arrays = {f"out_{s}_{i}": o for s in range(steps) for i, o in enumerate(res.outputs[s][rank])}
    arrays.update({f"w_{k}": v for k, v in res.weights[rank].items()})
    arrays["filled"] = np.array([r for r in range(world) if res.outputs[0][r] is not None])
    np.savez(os.path.join(folder, f"result_{rank}.npz"), **arrays)


if __name__ == "__main__":
    main()
