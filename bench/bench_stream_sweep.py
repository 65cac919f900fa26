"""The planner's choice and the simulated plans of ``bench_ground_truth.py`` as ``[efficiency]
stream`` varies (issue 39, item 5): the cluster file's other figures kept, ``stream`` set to
each value in turn (``none``: the file's own, or ``memory`` where it has none), the MLP's four
plans and the GPT-2's six simulated and set beside the step times measured by an earlier
``bench_ground_truth.py --planner`` run (its JSON files), with the simulator's errors and
Spearman's rank correlation; and ``partita.plan``'s choice for each model. No launches.

    .venv/bin/python bench/bench_stream_sweep.py                        # bench/results/ files
    .venv/bin/python bench/bench_stream_sweep.py --cluster this.toml --streams none 0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ground_truth as bg  # noqa: E402

import partita  # noqa: E402
from partita.cluster import load_cluster, simulate  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def row(cluster, model: str, measured: dict[str, list[float]]) -> str:
    """One model's simulated plans, errors, rank correlation and the planner's choice, as text."""
    step, _, _ = bg.build(model)
    names = [n for n in bg.PLANS if n in measured]
    sim = {n: simulate(partita.parallelize(step, **bg.PLANS[n]), cluster, memory=False).step_time * 1e3
           for n in names}
    meas = {n: statistics.median(measured[n]) for n in names}
    errs = [sim[n] / meas[n] - 1 for n in names]
    plan = partita.plan(step, cluster, None, devices=4)
    choice = bg.map_plan(plan, {n: bg.PLANS[n] for n in names}) or plan.describe()
    return (f"{model}: planner {choice}; " + " ".join(f"{n} {sim[n]:.1f}" for n in names)
            + f"; errors {min(errs):+.0%} .. {max(errs):+.0%}; Spearman "
            f"{bg.spearman([sim[n] for n in names], [meas[n] for n in names]):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", default=str(RESULTS / "this-machine.toml"))
    ap.add_argument("--measured", default=str(RESULTS / "ground_truth_planner_{model}.json"),
                    help="the measured runs' JSON, {model} standing for mlp and gpt")
    ap.add_argument("--streams", nargs="*", default=["none", "0.3", "0.45", "0.62", "0.8", "1.0"])
    args = ap.parse_args()
    base = load_cluster(args.cluster)
    measured = {m: json.loads(Path(args.measured.format(model=m)).read_text())["planner"]["measured_ms"]
                for m in ("mlp", "gpt")}
    for s in args.streams:
        value = base.efficiency.stream if s == "none" else float(s)
        cluster = dataclasses.replace(base, efficiency=dataclasses.replace(base.efficiency, stream=value))
        print(f"stream {s}: " + " || ".join(row(cluster, m, measured[m]) for m in ("mlp", "gpt")), flush=True)


if __name__ == "__main__":
    main()
