"""partita.models: gpt/llama graphs without weights mean what the Hugging Face models do, and
train and parallelize as the imported ones do."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.ir.verifier import verify
from partita.models import gpt, is_weightless, llama, load_hf_state_dict

B, T = 2, 16


def _hf_logits(lm, ids):
    import torch

    with torch.no_grad():
        return lm(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()


@pytest.mark.parametrize("attention,layout", [("fused", "bsh"), ("eager", "bsh"), ("eager", "sbh")])
def test_gpt_matches_hf_gpt2(attention, layout):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=257, n_positions=32, use_cache=False,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    g = gpt(layers=2, hidden=64, heads=4, seq=T, vocab=257, batch=B, dtype="f32", positions=32, attention=attention,
            layout=layout)
    assert is_weightless(g) and len(g.weights) == 0
    assert any(n.op == "attention" for n in g.nodes) == (attention == "fused")
    verify(g)
    load_hf_state_dict(g, lm.state_dict())
    ids = np.random.default_rng(0).integers(0, 257, (B, T)).astype(np.int64)
    got = partita.run(g, {"ids": ids})[0]
    np.testing.assert_allclose(got, _hf_logits(lm, ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_llama_matches_hf_llama(kv_heads):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=kv_heads, vocab_size=128, max_position_embeddings=32,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0)
    lm = transformers.LlamaForCausalLM(cfg).eval()
    g = llama(layers=2, hidden=64, heads=4, seq=T, vocab=128, kv_heads=kv_heads, ffn=128, batch=B, dtype="f32",
              eps=cfg.rms_norm_eps)
    assert is_weightless(g)
    sd = {k: v for k, v in lm.state_dict().items() if "rotary_emb" not in k}
    load_hf_state_dict(g, sd)
    ids = np.random.default_rng(1).integers(0, 128, (B, T)).astype(np.int64)
    got = partita.run(g, {"ids": ids})[0]
    np.testing.assert_allclose(got, _hf_logits(lm, ids), rtol=1e-4, atol=1e-4)


def test_scopes_name_the_layers():
    from partita.parallel.pipeline.stages import layer_of_path

    for g, layer in ((gpt(3, 64, 4, 8, 100, dtype="f32"), "transformer.h.{}"),
                     (llama(3, 64, 4, 8, 100, kv_heads=2, dtype="f32"), "model.layers.{}")):
        seen = set()
        for n in g.nodes:
            assert n.loc is not None and n.loc.scope, n
            lay = layer_of_path(n.loc.scope)
            if lay is not None:
                seen.add(lay)
                # every node reading a layer's param carries that layer's scope
                for v in n.operands:
                    if v.role == "param" and layer_of_path(str(v.name)) is not None:
                        assert layer_of_path(str(v.name)) == lay
        assert seen == {layer.format(i) for i in range(3)}


def test_bad_configs_say_why():
    with pytest.raises(ValueError, match="multiple of heads"):
        gpt(2, 65, 4, 8, 100)
    with pytest.raises(ValueError, match="kv_heads"):
        llama(2, 64, 4, 8, 100, kv_heads=3)
    with pytest.raises(Exception, match="dtype"):
        gpt(2, 64, 4, 8, 100, dtype="f64")
    with pytest.raises(ValueError, match="'fused', 'eager' or 'fused_softmax'"):
        gpt(2, 64, 4, 8, 100, attention="flash")
    with pytest.raises(ValueError, match=r"dropout=1.5 must be in \[0, 1\)"):
        gpt(2, 64, 4, 8, 100, dropout=1.5)


def test_gpt_dropout_trains():
    g = gpt(layers=2, hidden=32, heads=4, seq=8, vocab=64, batch=2, dtype="f32", attention="eager", dropout=0.1)
    drops = [n for n in g.nodes if n.op == "dropout"]
    assert len(drops) == 1 + 3 * 2 and all(n.attrs["train"] for n in drops)
    assert len({n.attrs["seed"] for n in drops}) == len(drops)        # each draws its own mask
    step = partita.training_step(g, loss="cross_entropy", optimizer="adamw")
    verify(step)


def test_gpt_fused_softmax_computes_what_eager_attention_computes():
    """attention="fused_softmax" runs one masked_softmax where "eager" runs scale, where and
    softmax: the same logits and the same gradients."""
    kw = dict(layers=2, hidden=32, heads=4, seq=8, vocab=64, batch=2, dtype="f32")
    eager, fused = gpt(**kw, attention="eager"), gpt(**kw, attention="fused_softmax")
    ops = [n.op for n in fused.nodes]
    assert ops.count("masked_softmax") == 2 and "softmax" not in ops and "where" not in ops
    rng = np.random.default_rng(0)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(np.float32)
         for v in eager.inputs if v.role == "param"}
    feed = {"ids": rng.integers(0, 64, (2, 8)), "target": rng.integers(0, 64, (2, 8))}
    ids = {"ids": feed["ids"]}
    np.testing.assert_allclose(partita.run(fused, ids, w)[0], partita.run(eager, ids, w)[0], rtol=1e-4, atol=1e-5)
    steps = [partita.training_step(g, loss="cross_entropy", optimizer=None) for g in (eager, fused)]
    assert sum(n.op == "masked_softmax_grad" for n in steps[1].nodes) == 2
    for a, b in zip(partita.run(steps[1], feed, w), partita.run(steps[0], feed, w)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("make", ["gpt", "llama"])
@pytest.mark.parametrize("mesh,strategy,extra", [
    ("pp=2,dp=2,tp=2", "pp+dp+megatron", dict(microbatches=4)),
    ("dp=2,tp=2", "dp+megatron+sp", {}),
])
def test_weightless_models_train_and_parallelize(make, mesh, strategy, extra):
    if make == "gpt":
        g = gpt(layers=4, hidden=64, heads=4, seq=16, vocab=257, batch=8, dtype="bf16")
    else:
        g = llama(layers=4, hidden=64, heads=4, seq=16, vocab=128, kv_heads=2, ffn=128, batch=8, dtype="bf16")
    step = partita.training_step(g, loss="cross_entropy", master_weights=True)
    assert len(step.weights) == 0
    prog = partita.parallelize(step, mesh=mesh, strategy=strategy, **extra)
    assert prog.plan is not None
    # nothing on the way (vocabulary padding included: 257 words split over tp=2) allocates
    # arrays for the params or the optimizer state
    assert len(prog.local.weights) == 0


def _structure(g):
    ins = [(str(v.name), v.role, str(v.type)) for v in g.inputs]
    # ops and types; attrs may be spelled differently (a reshape's -1 or its size) by the trace
    nodes = [(n.op, tuple(str(v.type) for v in n.operands), tuple(str(r.type) for r in n.results)) for n in g.nodes]
    return ins, nodes


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_import_of_a_meta_module_is_weightless(kind):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    class Logits(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(input_ids=ids, use_cache=False).logits

    if kind == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=257, n_positions=32, use_cache=False)
        make = transformers.GPT2LMHeadModel
    else:
        cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                       max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        make = transformers.LlamaForCausalLM
    ids = torch.randint(0, 100, (B, T))
    torch.manual_seed(0)
    real = partita.import_torch(Logits(make(cfg)).eval(), (ids,))
    with torch.device("meta"):
        m = Logits(make(cfg)).eval()
    meta = partita.import_torch(m, (ids.to("meta"),))
    assert not any(v.role == "param" and v.name in meta.weights for v in meta.inputs)
    assert len(meta.weights) == 0 and len(real.weights) > 0
    (ins_m, nodes_m), (ins_r, nodes_r) = _structure(meta), _structure(real)
    assert ins_m == ins_r
    for i, (a, b) in enumerate(zip(nodes_m, nodes_r)):
        assert a == b, f"node {i}: {a} != {b}"
    assert len(nodes_m) == len(nodes_r)
