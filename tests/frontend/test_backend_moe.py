"""The torch.compile backend on transformers' MoE decoders (Mixtral, Qwen2-MoE): dynamo traces
their experts as sorted grouped GEMMs; ``fx_moe.dispatch_form`` puts them in the import path's
dispatch form, so partita's program has the import path's steps (no sort, gather or scatter, no
grouped GEMM computed for every expert) and equals eager; dynamo's own graph is left as it was."""

from __future__ import annotations

import pytest
import torch

import partita.codegen.dynamo as pd
from partita.frontend.fx_moe import dispatch_form, grouped_mm_targets

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

transformers = pytest.importorskip("transformers")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.detach() - b.detach()).abs().max() / b.detach().abs().max()).item()


def mixtral() -> torch.nn.Module:
    cfg = transformers.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                     num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=32)
    return transformers.MixtralForCausalLM(cfg)


def qwen2_moe() -> torch.nn.Module:
    cfg = transformers.Qwen2MoeConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                      moe_intermediate_size=16, shared_expert_intermediate_size=32,
                                      num_experts=4, num_experts_per_tok=2, max_position_embeddings=32)
    return transformers.Qwen2MoeForCausalLM(cfg)


def built(make) -> torch.nn.Module:
    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():   # experts' weights large enough that a wrong route shows
        for m in model.modules():
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(m, name, None)
                if isinstance(p, torch.nn.Parameter) and p.dim() == 3:
                    p.copy_(torch.randn(p.shape) * 0.1)
    return model


def inputs() -> dict:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (3, 7), generator=g)    # 21 tokens: no power of two
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[1, :2] = 0
    return {"input_ids": ids, "attention_mask": mask, "use_cache": False}


@pytest.mark.parametrize("make", [mixtral, qwen2_moe], ids=["mixtral", "qwen2_moe"])
def test_moe_decoder_runs_partitas_program_in_the_dispatch_form(make) -> None:
    model, kw = built(make), inputs()
    compiled = torch.compile(model, backend="partita", dynamic=False,
                             options={"fallback": "error", "choose": "partita"})
    with torch.no_grad():
        want = model(**kw).logits
        got = compiled(**kw).logits
        again = compiled(**kw).logits
    assert rel(got, want) <= 1e-5 and rel(again, want) <= 1e-5
    st = pd.stats()
    assert st.fallbacks == 0 and len(st.graphs) == 1 and st.graphs[0].kind == "inference"
    program = st.graphs[0].program
    assert program is not None
    ops = [n.op for n in program.graph.nodes]
    assert ops.count("topk") == 2, ops
    for gone in ("sort", "scatter_elements", "int_div", "index_select", "where"):
        assert gone not in ops, (gone, ops)


def test_dispatch_form_rewrites_each_layer_and_leaves_dynamos_graph() -> None:
    model, kw = built(mixtral), inputs()
    seen: list = []

    def backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    with torch.no_grad():
        want = model(**kw).logits
        torch.compile(model, backend=backend, dynamic=False)(**kw)
    ((gm, args),) = seen
    targets = grouped_mm_targets()
    before = sum(1 for n in gm.graph.nodes if n.target in targets)
    new, blocks = dispatch_form(gm)
    assert blocks == 2 and new is not gm
    assert sum(1 for n in gm.graph.nodes if n.target in targets) == before == 4
    assert not any(n.target in targets or n.target is torch.sort for n in new.graph.nodes)
    with torch.no_grad():
        assert rel(new(*args)[0], want) <= 1e-5 and rel(gm(*args)[0], want) <= 1e-5


def test_a_graph_without_experts_is_left_as_it_is() -> None:
    seen: list = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm.forward

    torch.compile(lambda x: torch.sort(x)[1] // 2, backend=backend)(torch.randn(8))
    assert dispatch_form(seen[0]) == (seen[0], 0)


def test_training_through_the_dispatch_form_matches_eager() -> None:
    """Under autograd the rewritten forward and AOTAutograd's backward of it give eager's gradients."""
    model, kw = built(mixtral), inputs()
    model.train()
    kw = dict(kw, labels=kw["input_ids"])
    model(**kw).loss.backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    compiled = torch.compile(model, backend="partita", dynamic=False, options={"fallback": "error"})
    compiled(**kw).loss.backward()
    assert pd.stats().fallbacks == 0
    for k, g in want.items():
        got = dict(model.named_parameters())[k].grad
        assert got is not None and rel(got, g) <= 1e-4, k
