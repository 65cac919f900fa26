"""Transformer graphs built from a config, shapes only: ``gpt(...)`` and ``llama(...)``.

They return the forward graph ``ids [batch, seq] i64 -> logits [batch, seq, vocab]`` with
the params as ``param`` inputs and no arrays in ``graph.weights``: a weightless graph, which
costs the same to build and parallelize at 1T parameters as at 100M. The op structure is the
one ``import_torch`` gives for Hugging Face's GPT2LMHeadModel (after ``split-projections``)
and LlamaForCausalLM, so every strategy treats them alike, and the param names are those
models' state_dict names (``load_hf_state_dict`` fills a graph from one).
"""

from ._build import ModelError
from .gpt import gpt
from .hf import is_weightless, load_hf_state_dict
from .llama import llama
from .named import NAMED_MODELS, NamedModel, hf_config_model, named_model

__all__ = ["ModelError", "gpt", "llama", "load_hf_state_dict", "is_weightless", "NAMED_MODELS", "NamedModel",
           "named_model", "hf_config_model"]
