"""Digest of the per-rank programs partita emits for a fixed set of parallel cases: the
check that a refactoring changed no program (run it before and after, at two commits, and
compare the output).

    .venv/bin/python tools/rank_programs_digest.py > before.txt     # at the old commit
    .venv/bin/python tools/rank_programs_digest.py > after.txt      # at the new one
    diff before.txt after.txt                                       # nothing: byte-identical

Each line is a case, the SHA-256 of its per-rank program texts (``print_graph`` of every
distinct rank program, in rank order) and of its plan's text. ``--show CASE`` prints one
case's programs.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import warnings

CASES: list[tuple[str, str, str, dict]] = [
    # (name, mesh, strategy, extra parallelize options)
    ("dp", "dp=2", "dp", {}),
    ("zero1", "dp=2", "zero1", {}),
    ("zero2", "dp=2", "zero2", {}),
    ("zero3", "dp=2", "zero3", {}),
    ("megatron", "tp=2", "megatron", {}),
    ("megatron+sp", "tp=2", "megatron+sp", {}),
    ("dp+megatron", "dp=2,tp=2", "dp+megatron", {}),
    ("zero3+megatron", "dp=2,tp=2", "zero3+megatron", {}),
    ("pp+dp 1f1b", "pp=2,dp=2", "pp+dp", {"microbatches": 4}),
    ("pp gpipe", "pp=2", "pp", {"microbatches": 2, "schedule": "gpipe"}),
    ("pp interleaved", "pp=2", "pp", {"microbatches": 4, "schedule": "interleaved", "virtual_stages": 2}),
    ("pp zero-bubble", "pp=2", "pp", {"microbatches": 4, "schedule": "zero-bubble"}),
    ("pp+dp+megatron", "pp=2,dp=2,tp=2", "pp+dp+megatron", {"microbatches": 4}),
]


def _programs(name: str, mesh: str, strategy: str, extra: dict) -> tuple[list[str], str]:
    import partita
    from partita.ir.printer import print_graph

    fwd = partita.models.gpt(layers=4, hidden=32, heads=4, seq=8, vocab=64, batch=8, dtype="f32", dropout=0.1)
    if "megatron" in strategy:
        from partita.passes.split_projections import split_projections

        split_projections(fwd)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", recompute="selective")
    prog = partita.parallelize(step, mesh, strategy, **extra)
    if hasattr(prog, "rank_graphs"):
        graphs = prog.rank_graphs()
    else:
        graphs = [prog.local]
    seen: dict[int, None] = {}
    texts = []
    for g in graphs:
        if id(g) not in seen:
            seen[id(g)] = None
            texts.append(print_graph(g))
    plan = prog.plan.text() if hasattr(prog.plan, "text") else str(prog.plan)
    return texts, plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--show", help="print the programs of this case")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    for name, mesh, strategy, extra in CASES:
        if args.show and args.show != name:
            continue
        texts, plan = _programs(name, mesh, strategy, extra)
        if args.show:
            print("\n\n".join(texts))
            print(plan)
            continue
        h = hashlib.sha256("\n\x00\n".join(texts).encode()).hexdigest()[:16]
        p = hashlib.sha256(plan.encode()).hexdigest()[:16]
        print(f"{name:<16} programs {h}  plan {p}  ({len(texts)} distinct rank programs)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
