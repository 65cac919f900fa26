"""The planner plans a chain of linear layers (an MLP, no sequence): its shape read off the
graph, dp / zero / megatron tp meshes priced, pp refused with why (its layers are not named
for a cut), every mesh it offers computing on run_mesh what one device computes, and the
transformer rows planned as before."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.cluster.hardware import load_cluster
from partita.planning import PlanError, model_shape
from partita.planning.search import candidate_plan, enumerate_candidates


def mlp_step(batch: int = 32, widths: tuple[int, ...] = (16, 64, 64, 16), weight: str = "w{i}") -> partita.Graph:
    """An MLP (linear layers, GELU between them) as a training step, MSE and AdamW; layer i's
    weight is named ``weight.format(i=i)``."""
    names = [weight.format(i=i) for i in range(len(widths) - 1)]
    params = ", ".join(f"%{n}: f32[{a}, {b}] param" for n, a, b in zip(names, widths, widths[1:]))
    lines, x = [], "%x"
    for i, b in enumerate(widths[1:]):
        lines.append(f"  %h{i} = matmul({x}, %{names[i]}) : f32[{batch}, {b}]")
        x = f"%h{i}"
        if i < len(widths) - 2:
            lines.append(f"  %g{i} = gelu({x}) : f32[{batch}, {b}]")
            x = f"%g{i}"
    text = (f"graph @mlp(%x: f32[{batch}, {widths[0]}] input, {params}) -> (f32[{batch}, {widths[-1]}]) {{\n"
            + "\n".join(lines) + f"\n  return {x}\n}}")
    return partita.training_step(partita.parse(text), loss="mse", optimizer="adamw")


def test_shape_of_an_mlp():
    shape = model_shape(mlp_step())
    assert (shape.batch, shape.seq, shape.layers, shape.hidden) == (32, 1, 3, 64)
    assert shape.params == 16 * 64 + 64 * 64 + 64 * 16
    assert not shape.pipeline
    assert shape.step_model_flops() == pytest.approx(3 * 2 * 32 * (16 * 64 + 64 * 64 + 64 * 16))


def test_plan_of_an_mlp_says_why_pp_is_out():
    p = partita.plan(mlp_step(), "dgx-h100", devices=4)
    assert p.step_time and p.memory and "pp" not in p.axes
    assert any("pipeline" in why for why in p.report["refused"])
    assert p.report["families"]["cp"].startswith("not searched: the model has no sequence")
    assert all("pp=" in x for x in p.report["invalid"])


def test_every_mlp_mesh_computes_what_one_device_does():
    step = mlp_step()
    shape = model_shape(step)
    cl = load_cluster("dgx-h100")
    cands, _ = enumerate_candidates(shape, cl, 4, ("none",))
    plans = {candidate_plan(shape, c, 4, cl).describe(): candidate_plan(shape, c, 4, cl) for c in cands}
    assert {"dp=4 dp", "dp=4 zero3", "tp=4 megatron", "dp=2,tp=2 dp+megatron"} <= {k.split(" recompute")[0]
                                                                                   for k in plans}
    rng = np.random.default_rng(0)
    weights = {str(v.name): (rng.standard_normal(v.type.shape) * 0.1).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    inputs = {str(v.name): rng.standard_normal(v.type.shape).astype(np.float32)
              for v in step.inputs if v.role == "input"}
    prog0 = partita.parallelize(step, mesh="dp=1", strategy="dp")
    want = prog0.simulate(inputs, weights)
    for name, p in plans.items():
        got = partita.parallelize(step, plan=p).simulate(inputs, weights)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)


def test_a_graph_that_is_no_chain_is_refused_with_why():
    text = ("graph @two(%x: f32[8, 4] input, %a: f32[4, 4] param, %b: f32[4, 4] param) -> (f32[8, 4]) {\n"
            "  %h = matmul(%x, %a) : f32[8, 4]\n  %k = matmul(%x, %b) : f32[8, 4]\n  %s = add(%h, %k) : f32[8, 4]\n"
            "  return %s\n}")
    g = partita.parse(text)
    with pytest.raises(PlanError, match="chain of linear layers"):
        model_shape(g)


def test_biases_between_layers_are_read():
    text = ("graph @b(%x: f32[8, 4] input, %a: f32[4, 8] param, %c: f32[8] param, %d: f32[8, 4] param) -> (f32[8, 4]) {\n"
            "  %h = matmul(%x, %a) : f32[8, 8]\n  %k = add(%h, %c) : f32[8, 8]\n  %r = relu(%k) : f32[8, 8]\n"
            "  %o = matmul(%r, %d) : f32[8, 4]\n  return %o\n}")
    shape = model_shape(partita.parse(text))
    assert (shape.batch, shape.layers, shape.params, shape.widths) == (8, 2, 72, (4, 8, 4))


def named_mlp_step(batch: int = 32, widths: tuple[int, ...] = (16, 64, 64, 64, 16)) -> partita.Graph:
    """An MLP whose weights are named fc.<i>.w: partita's pipeline can cut it between layers."""
    return mlp_step(batch, widths, weight="fc.{i}.w")


def test_pipelined_mlp_meshes_compute_what_one_device_does():
    step = named_mlp_step()
    shape = model_shape(step)
    assert shape.pipeline and shape.layers == 4
    cl = load_cluster("dgx-h100")
    cands, _ = enumerate_candidates(shape, cl, 4, ("none",))
    plans = {}
    for c in cands:
        if c.pp > 1:
            plans.setdefault((c.pp, c.dp, c.tp, c.zero, c.schedule, c.virtual_stages), candidate_plan(shape, c, 4, cl))
    assert {(2, 2, 1), (2, 1, 2), (4, 1, 1)} <= {k[:3] for k in plans}
    rng = np.random.default_rng(0)
    weights = {str(v.name): (rng.standard_normal(v.type.shape) * 0.1).astype(np.float32)
               for v in step.inputs if v.role == "param"}
    inputs = {str(v.name): rng.standard_normal(v.type.shape).astype(np.float32)
              for v in step.inputs if v.role == "input"}
    want = partita.parallelize(step, mesh="dp=1", strategy="dp").simulate(inputs, weights)
    for key, p in plans.items():
        got = partita.parallelize(step, plan=p).simulate(inputs, weights)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=str(key))
    best = partita.plan(step, "dgx-h100", devices=4)
    assert not best.report["failed"] and "refused" not in best.report
