"""adamw with master_weights: bf16 params trained through f32 master copies, as Megatron-LM
does; checked against torch.optim.AdamW on the f32 master with the f32-cast gradient."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.ir.builder import Builder
from partita.ir.dtypes import bf16, f32
from partita.ir.graph import Graph
from partita.ir.types import TensorType

OPT = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def _mlp(dtype, weights: bool = True) -> Graph:
    g = Graph("mlp")
    b = Builder(g)
    x = b.input("x", TensorType((8, 16), dtype))
    w1 = b.param("w1", TensorType((16, 32), dtype))
    w2 = b.param("w2", TensorType((32, 4), dtype))
    b.ret(b.matmul(b.gelu(b.matmul(x, w1)), w2))
    if weights:
        rng = np.random.default_rng(0)
        g.weights["w1"] = rng.standard_normal((16, 32)).astype(dtype.np)
        g.weights["w2"] = rng.standard_normal((32, 4)).astype(dtype.np)
    return g


def test_master_weights_state_and_types():
    step = partita.training_step(_mlp(bf16), loss="mse", master_weights=True, **OPT)
    ins = {str(v.name): v for v in step.inputs}
    for p in ("w1", "w2"):
        assert ins[p].type.dtype == bf16
        for s in ("master", "exp_avg", "exp_avg_sq"):
            assert ins[f"{p}.{s}"].role == "state" and ins[f"{p}.{s}"].type.dtype == f32
        np.testing.assert_array_equal(step.weights[f"{p}.master"], np.asarray(step.weights[p], np.float32))
    outs = {str(v.name): (v, a) for v, a in zip(step.outputs, step.output_aliases)}
    new_p, alias = outs["w1.1"]
    assert new_p.type.dtype == bf16 and alias is ins["w1"] and new_p.producer.op == "cast"
    assert outs["w1.master.1"][1] is ins["w1.master"]
    # per param: 2 bytes of bf16 param and 12 bytes of f32 state (ZeRO's K = 12)
    n = 16 * 32
    state = sum(ins[f"w1.{s}"].type.nbytes for s in ("master", "exp_avg", "exp_avg_sq"))
    assert ins["w1"].type.nbytes == 2 * n and state == 12 * n


def test_master_weights_is_off_by_default_and_leaves_f32_alone():
    names = {str(v.name) for v in partita.training_step(_mlp(bf16), loss="mse").inputs}
    assert "w1.master" not in names
    names = {str(v.name) for v in partita.training_step(_mlp(f32), loss="mse", master_weights=True).inputs}
    assert "w1.master" not in names


def test_master_weights_match_torch_adamw_on_the_master():
    torch = pytest.importorskip("torch")
    fwd = _mlp(bf16)
    step = partita.training_step(fwd, loss="mse", master_weights=True, keep_grads=True, **OPT)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16)).astype(bf16.np)
    target = rng.standard_normal((8, 4)).astype(bf16.np)
    outs = partita.run(step, {"x": x, "target": target})
    got = {str(v.name): o for v, o in zip(step.outputs, outs)}
    for p in ("w1", "w2"):
        master = torch.tensor(np.asarray(fwd.weights[p], np.float32), requires_grad=True)
        master.grad = torch.tensor(np.asarray(got[f"{p}.grad"], np.float32))
        opt = torch.optim.AdamW([master], lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"],
                                weight_decay=OPT["weight_decay"])
        opt.step()
        want = master.detach()
        np.testing.assert_allclose(np.asarray(got[f"{p}.master.1"], np.float32), want.numpy(), rtol=1e-6, atol=1e-7)
        want_p = want.to(torch.bfloat16).float().numpy()
        np.testing.assert_array_equal(np.asarray(got[f"{p}.1"], np.float32), want_p)
        st = opt.state[master]
        np.testing.assert_allclose(got[f"{p}.exp_avg.1"], st["exp_avg"].numpy(), rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(got[f"{p}.exp_avg_sq.1"], st["exp_avg_sq"].numpy(), rtol=1e-6, atol=1e-10)


def test_weightless_step_allocates_no_state():
    step = partita.training_step(_mlp(bf16, weights=False), loss="mse", master_weights=True)
    assert len(step.weights) == 0
    step = partita.training_step(_mlp(f32, weights=False), loss="mse", optimizer="sgd", momentum=0.9)
    assert len(step.weights) == 0


def test_trainer_fills_missing_state():
    from partita.autodiff.training import Trainer

    fwd = _mlp(bf16)
    step = partita.training_step(fwd, loss="mse", master_weights=True, **OPT)
    params = {k: np.asarray(v) for k, v in fwd.weights.items()}
    tr = Trainer(step, weights=params, backend="numpy")
    np.testing.assert_array_equal(tr.values["w1.master"], np.asarray(params["w1"], np.float32))
    assert not tr.values["w1.exp_avg"].any()


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
def test_zero_shards_the_master_and_moments(strategy):
    step = partita.training_step(_mlp(bf16), loss="mse", master_weights=True, **OPT)
    prog = partita.parallelize(step, mesh="dp=2", strategy=strategy)
    local = {str(v.name): v for v in prog.local.inputs}
    for s in ("master", "exp_avg", "exp_avg_sq"):
        assert local[f"w1.{s}"].type.shape == (8, 32), (s, local[f"w1.{s}"].type)
    x = np.random.default_rng(2).standard_normal((8, 16)).astype(bf16.np)
    t = np.random.default_rng(3).standard_normal((8, 4)).astype(bf16.np)
    want = partita.run(step, {"x": x, "target": t})
    got = prog.simulate({"x": x, "target": t})
    for v, w, o in zip(step.outputs, want, got):
        np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(w, np.float32), rtol=2e-2, atol=2e-2,
                                   err_msg=str(v.name))
