"""Per-node times of partita's codegen executor beside ONNX Runtime's, for one model of
bench_codegen.py: each of partita's steps timed one by one (bench_codegen.StepProfiler), ORT with
its own profiler (bench_codegen.OrtProfiler), the two called in turn for ``--calls`` calls after
3 warm-up calls each. Prints partita's nodes of the ops asked for (shapes, attributes, ms a
call) in program order, then ORT's nodes (name, ms a call) in its order.

Run:  .venv/bin/python bench/profile_nodes.py --model cnn --ops conv2d_pointwise
      .venv/bin/python bench/profile_nodes.py --model vit --ops linear_pointwise,attention,layer_norm
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bench_codegen as B  # noqa: E402
import partita  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="cnn", choices=[m for m in B.MODELS if m != "gpt2-train"])
    ap.add_argument("--ops", default="conv2d_pointwise", help="comma-separated partita ops to list")
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="the benchmark's tiny sizes (a smoke test)")
    ap.add_argument("--summary", action="store_true",
                    help="ms a call summed per op (partita) and per op type (ORT) instead of node by node")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    B.THREADS = args.threads
    ops = set(args.ops.split(","))
    case = B.make_case(args.model, B.QUICK if args.quick else B.FULL)
    case.module.eval()
    graph = partita.import_torch(case.module, case.args)
    with tempfile.TemporaryDirectory() as work:
        ort = B.build_ort(case, work)
        if ort["session"] is None:
            print("ONNX Runtime could not run the model:", "; ".join(ort["errors"]))
            return 1
        with torch.no_grad():
            ref = case.module(*case.args)
        built = B.build_partita("codegen", graph, case.args, [ref])
        prog = built["prog"]
        mine = B.StepProfiler(B._torch_program(prog), lambda: prog(built["inputs"]))
        theirs = B.OrtProfiler(ort["path"], ort["feeds"], work)
        for _ in range(3):
            mine.call()
            theirs.call()
        mine.reset()
        theirs.reset()
        for _ in range(args.calls):
            mine.call()
            theirs.call()
        rows = []
        per_op: dict[str, float] = {}
        for st, t in zip(mine.orig, mine.acc):
            n = st[7]
            per_op[n.op] = per_op.get(n.op, 0.0) + t / args.calls * 1e3
            if n.op in ops:
                shapes = " x ".join(str(list(v.type.shape)) for v in n.operands[:2])
                attrs = {k: n.attrs[k] for k in ("stride", "binary", "unary") if k in n.attrs}
                rows.append((n.op, shapes, attrs, t / args.calls * 1e3))
        mine.tp.steps[:] = mine.orig
        events = json.loads(Path(theirs.sess.end_profiling()).read_text())
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    start = runs[theirs.skip] if len(runs) > theirs.skip else 0
    nodes: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
            name = f"{e['args'].get('op_name', '?')} {e['name'][:-len('_kernel_time')]}"
            nodes[name] = nodes.get(name, 0.0) + e["dur"] / 1e3 / args.calls
    print(f"{case.label}, {args.threads} thread(s), {args.calls} calls each; ms a call")
    if args.summary:
        types: dict[str, float] = {}
        for name, ms in nodes.items():
            types[name.split(" ")[0]] = types.get(name.split(" ")[0], 0.0) + ms
        print(f"partita: {mine.wall / max(mine.calls, 1) * 1e3:.2f} a call, steps {sum(per_op.values()):.2f}")
        for op, ms in sorted(per_op.items(), key=lambda kv: -kv[1]):
            print(f"  {op:<24} {ms:.3f}")
        print(f"ORT: {theirs.wall / max(theirs.calls, 1) * 1e3:.2f} a call, nodes {sum(types.values()):.2f}")
        for op, ms in sorted(types.items(), key=lambda kv: -kv[1]):
            print(f"  {op:<24} {ms:.3f}")
        return 0
    print(f"partita: {mine.wall / max(mine.calls, 1) * 1e3:.2f} a call, listed ops {sum(r[3] for r in rows):.2f}")
    for op, shapes, attrs, ms in rows:
        print(f"  {op:<18} {shapes:<40} {attrs} {ms:.3f}")
    print(f"ORT: {theirs.wall / max(theirs.calls, 1) * 1e3:.2f} a call")
    for name, ms in nodes.items():
        print(f"  {name} {ms:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
