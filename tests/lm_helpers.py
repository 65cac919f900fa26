"""A small transformers causal LM compiled by partita.codegen beside its eager logits: what the
codegen tests that run a whole model (GPT-2, Llama) share."""

from __future__ import annotations

import torch


class Logits(torch.nn.Module):
    """The model's logits for ``input_ids``, without the KV cache."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, ids):
        return self.m(input_ids=ids, use_cache=False).logits


def compiled_lm(model, vocab: int = 100, shape: tuple = (2, 16)):
    """(CompiledProgram of ``model``'s logits after the benchmark's pipeline, the ids, eager's logits)."""
    import partita
    from partita.codegen import CompiledProgram
    from partita.frontend.torch_export import import_torch

    ids = torch.randint(0, vocab, shape)
    wrapped = Logits(model.eval()).eval()
    g = partita.optimize(import_torch(wrapped, (ids,)), "fuse-activations,canonicalize,cse,fold-constants,dce")
    with torch.no_grad():
        want = wrapped(ids)
    return CompiledProgram(g), ids, want
