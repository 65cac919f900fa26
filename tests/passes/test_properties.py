"""Semantic properties of every pass on random valid graphs (``strategies.graphs``).

For each pass and for the pipeline ``canonicalize,cse,fold-constants,dce``: the result
verifies, and the reference interpreter gives the same outputs before and after (a tight
tolerance, NaN at the same places). Plus what each pass promises: a second run changes
nothing, DCE leaves no dead pure node, CSE leaves no two equal pure nodes.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from partita.ir import print_graph, verify
from partita.ir.printer import format_attr
from partita.ops.registry import OPS
from partita.passes import PassManager
from partita.passes.rewrite import has_effects

from strategies import assert_same_outputs, graphs, random_inputs, run_reference

PROPERTY = settings(max_examples=40, deadline=None, database=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

PIPELINES = ["dce", "cse", "fold-constants", "canonicalize", "canonicalize,cse,fold-constants,dce",
             "fold-constants{max-elements=2},canonicalize,cse,dce", "fuse-activations,dce",
             # the code generator's passes (partita/codegen), in CompiledProgram's order
             "fold-batch-norm,fuse-library,assign-layout,fuse-kernels,dce"]


def _optimize(pipeline: str, g):
    # verify_each=True: the manager verifies the input and the result of every pass.
    return PassManager.parse(pipeline, reproducer_dir=None).run(g)


@pytest.mark.parametrize("pipeline", PIPELINES)
@PROPERTY
@given(g=graphs())
def test_passes_preserve_meaning(pipeline, g):
    text = print_graph(g)
    inputs = random_inputs(g, seed=zlib.crc32(text.encode()))
    before = run_reference(g, inputs)
    out = _optimize(pipeline, g)
    verify(out)
    assert_same_outputs(before, run_reference(out, inputs), f"{pipeline} on\n{text}\ngave\n{print_graph(out)}")


@pytest.mark.parametrize("pipeline", ["dce", "cse", "fold-constants", "canonicalize"])
@PROPERTY
@given(g=graphs())
def test_a_second_run_changes_nothing(pipeline, g):
    once = print_graph(_optimize(pipeline, g))
    assert print_graph(_optimize(pipeline, g)) == once


@PROPERTY
@given(g=graphs())
def test_dce_leaves_no_dead_pure_node(g):
    out = _optimize("dce", g)
    for n in out.nodes:
        assert has_effects(n) or any(r.has_uses for r in n.results), f"dead {n.op} survived"


@PROPERTY
@given(g=graphs())
def test_cse_leaves_no_duplicates(g):
    out = _optimize("cse", g)
    seen = set()
    for n in out.nodes:
        if has_effects(n):
            continue
        ids = tuple(map(id, n.operands))
        if OPS[n.op].commutative:
            ids = tuple(sorted(ids))
        key = (n.op, ids, tuple((k, format_attr(v)) for k, v in n.attrs.items()))
        assert key not in seen, f"two {n.op} nodes with the same operands and attributes survived"
        seen.add(key)


@PROPERTY
@given(g=graphs(kinds=("binary", "unary", "splat", "cast")))
def test_fast_math_canonicalize_is_exact_on_finite_values(g):
    # Random inputs are finite; NaN/inf can still appear inside the graph (log of a negative,
    # 1/0), where fast-math may differ: compare only when the original has none anywhere.
    text = print_graph(g)
    inputs = random_inputs(g, seed=zlib.crc32(text.encode()))
    before = run_reference(g, inputs)
    everything = g.clone()  # every value an output, to see whether any is not finite
    everything.set_outputs([v for n in everything.nodes for v in n.results])
    values = [np.asarray(a) for a in run_reference(everything, inputs)]
    if any(a.dtype.kind not in "biu" and not np.isfinite(a.astype(np.float64)).all() for a in values):
        return
    out = _optimize("canonicalize{fast-math=true}", g)
    assert_same_outputs(before, run_reference(out, inputs), f"fast-math canonicalize on\n{text}")
