"""Named model configs: published GPT and Llama shapes by name, built weightless.

``NAMED_MODELS`` maps a name to a ``NamedModel``: the builder (``gpt`` or ``llama``), its
shape and the sequence length and global batch its source trained with (the defaults of
``partita simulate --model``). ``named_model(name)`` looks one up with a clear error;
``NamedModel.build(seq=, batch=)`` makes the forward graph; ``NamedModel.params`` counts its
parameters without building it.

Sources:

- ``gpt3-175b``: Brown et al. 2020 (GPT-3), Table 2.1: 96 layers, d_model 12,288, 96 heads,
  context 2,048, batch 3.2M tokens (1,536 sequences); the vocabulary padded to 51,200 as
  Megatron-LM trains it (Narayanan et al. 2021), the plan of docs/benchmarks.md.
- ``megatron-*``: Narayanan et al. 2021 (Megatron-LM), Table 1, the ten GPT rows: heads,
  hidden, layers and global batch of each row, sequence 2,048, vocabulary 51,200 (as
  bench/bench_simulate.py's ``MEGATRON_T1``).
- ``llama3-*``: Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3: layers, model
  dimension, FFN dimension, attention and key/value heads, RoPE theta 500,000; sequence 8,192
  (Sec. 3.4.1); global batch 512 sequences (the 405B's initial 4M tokens a step, Sec. 3.4.1;
  the paper gives none for 8B and 70B). The vocabulary is 128,256, the released models'
  ``vocab_size`` (the paper's "128K tokens"; Table 3 rounds it to 128,000): what
  ``load_hf_state_dict`` needs to fill a graph from the released weights, and 8.03e9
  parameters for 8B.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.graph import Graph
from ._build import ModelError
from .gpt import gpt
from .llama import llama, llama_ffn


@dataclass(frozen=True)
class NamedModel:
    """A published model's shape: ``family`` is the builder (``gpt`` or ``llama``)."""

    name: str
    family: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int                          # the sequence length it trained with (the default)
    batch: int                        # its global batch in sequences (the default)
    kv_heads: int | None = None       # llama: key/value heads (grouped-query attention)
    ffn: int | None = None            # the MLP width (gpt: 4 * hidden; llama: llama_ffn(hidden))
    rope_theta: float = 10000.0
    source: str = ""
    positions: int | None = None      # gpt: rows of the position table (the sequence length)

    def build(self, seq: int | None = None, batch: int | None = None, dtype: str = "bf16") -> Graph:
        """The weightless forward graph at ``seq`` and ``batch`` (default the model's own)."""
        seq = self.seq if seq is None else seq
        batch = self.batch if batch is None else batch
        if self.family == "gpt":
            return gpt(self.layers, self.hidden, self.heads, seq, self.vocab, batch=batch, dtype=dtype, ffn=self.ffn,
                       positions=self.positions, name=self.graph_name)
        return llama(self.layers, self.hidden, self.heads, seq, self.vocab, kv_heads=self.kv_heads, ffn=self.ffn,
                     batch=batch, dtype=dtype, rope_theta=self.rope_theta, name=self.graph_name)

    @property
    def graph_name(self) -> str:
        """The name its graph gets (an identifier)."""
        return "".join(c if c.isalnum() else "_" for c in self.name) or "model"

    def params(self, seq: int | None = None) -> int:
        """Its parameter count (a GPT's position table grows with ``seq``), without building it."""
        h, v = self.hidden, self.vocab
        if self.family == "gpt":
            f = 4 * h if self.ffn is None else self.ffn
            layer = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
            rows = self.positions or (self.seq if seq is None else seq)
            return self.layers * layer + v * h + rows * h + 2 * h
        f = llama_ffn(h) if self.ffn is None else self.ffn
        kv = (self.kv_heads or self.heads) * (h // self.heads)
        layer = 2 * h + 2 * h * h + 2 * h * kv + 3 * h * f
        return self.layers * layer + 2 * v * h + h


def _megatron(name: str, heads: int, hidden: int, layers: int, batch: int) -> NamedModel:
    return NamedModel(f"megatron-{name.lower()}", "gpt", layers, hidden, heads, 51200, 2048, batch,
                      source="Narayanan et al. 2021, Table 1")


def _llama3(size: str, layers: int, hidden: int, ffn: int, heads: int) -> NamedModel:
    return NamedModel(f"llama3-{size}", "llama", layers, hidden, heads, 128256, 8192, 512, kv_heads=8, ffn=ffn,
                      rope_theta=500000.0, source="Dubey et al. 2024, Table 3")


# Narayanan et al. 2021, Table 1: (name, heads, hidden, layers, global batch).
MEGATRON_TABLE1_MODELS = [
    ("1.7B", 24, 2304, 24, 512), ("3.6B", 32, 3072, 30, 512), ("7.5B", 32, 4096, 36, 512),
    ("18.4B", 48, 6144, 40, 1024), ("39.1B", 64, 8192, 48, 1536), ("76.1B", 80, 10240, 60, 1792),
    ("145.6B", 96, 12288, 80, 2304), ("310.1B", 128, 16384, 96, 2160), ("529.6B", 128, 20480, 105, 2520),
    ("1008B", 160, 25600, 128, 3072),
]

NAMED_MODELS: dict[str, NamedModel] = {m.name: m for m in [
    NamedModel("gpt3-175b", "gpt", 96, 12288, 96, 51200, 2048, 1536, source="Brown et al. 2020, Table 2.1"),
    *(_megatron(*row) for row in MEGATRON_TABLE1_MODELS),
    _llama3("8b", 32, 4096, 14336, 32),
    _llama3("70b", 80, 8192, 28672, 64),
    _llama3("405b", 126, 16384, 53248, 128),
]}


def named_model(name: str) -> NamedModel:
    """The named config ``name`` (case-insensitive); a ModelError listing the names otherwise."""
    m = NAMED_MODELS.get(name.strip().lower())
    if m is None:
        raise ModelError(f"no model named '{name:.60}'; the named models are " + ", ".join(NAMED_MODELS))
    return m


# transformers model types the builders cover: model_type -> builder.
HF_DECODERS = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gpt2": "gpt"}
# The sequence and batch of a config file that names none of its own (at most its positions).
HF_DEFAULT_SEQ, HF_DEFAULT_BATCH = 4096, 8


def _hf_int(cfg: dict, key: str, default: int | None = None) -> int:
    """``cfg[key]`` as a positive whole number (``default`` when absent and given)."""
    x = cfg.get(key)
    if x is None:
        if default is None:
            raise ModelError(f"the config has no '{key}', which a {cfg.get('model_type')} config needs")
        return default
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ModelError(f"the config's '{key}' is {x!r:.40}; it must be a whole number of at least 1")
    return x


def hf_config_model(cfg: object, name: str = "hf") -> tuple[NamedModel, list[str]]:
    """The ``NamedModel`` of a transformers decoder config (the parsed ``config.json``) and notes
    on what of it the weightless graph leaves out; a ModelError for a config the builders do
    not cover, naming its model_type and the supported ones."""
    if not isinstance(cfg, dict):
        raise ModelError(f"the config is a JSON {type(cfg).__name__}, not an object with a model_type")
    mt = cfg.get("model_type")
    if mt is None:
        raise ModelError("the config has no 'model_type' (a transformers config.json names its architecture, e.g. "
                         "\"model_type\": \"llama\"); supported model types: " + ", ".join(HF_DECODERS))
    if mt not in HF_DECODERS:
        raise ModelError(f"model_type {mt!r:.60} is not a decoder the builders cover; supported model types: "
                         + ", ".join(HF_DECODERS) + " (a Llama-like config: hidden_size, num_hidden_layers, "
                         "num_attention_heads, num_key_value_heads, intermediate_size, vocab_size)")
    notes: list[str] = []
    if HF_DECODERS[mt] == "gpt":
        positions = _hf_int(cfg, "n_positions", 1024)
        inner = cfg.get("n_inner")
        m = NamedModel(name, "gpt", _hf_int(cfg, "n_layer"), _hf_int(cfg, "n_embd"), _hf_int(cfg, "n_head"),
                       _hf_int(cfg, "vocab_size"), min(positions, HF_DEFAULT_SEQ), HF_DEFAULT_BATCH,
                       ffn=None if inner is None else _hf_int(cfg, "n_inner"), positions=positions,
                       source="a transformers config")
        return m, notes
    hidden, heads = _hf_int(cfg, "hidden_size"), _hf_int(cfg, "num_attention_heads")
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        raise ModelError(f"head_dim {head_dim!r:.20} x num_attention_heads {heads} is not hidden_size {hidden}; the "
                         "llama builder makes heads of hidden_size / num_attention_heads")
    theta = cfg.get("rope_theta", 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ModelError(f"the config's 'rope_theta' is {theta!r:.40}; it must be a positive number")
    positions = _hf_int(cfg, "max_position_embeddings", HF_DEFAULT_SEQ)
    m = NamedModel(name, "llama", _hf_int(cfg, "num_hidden_layers"), hidden, heads, _hf_int(cfg, "vocab_size"),
                   min(positions, HF_DEFAULT_SEQ), HF_DEFAULT_BATCH,
                   kv_heads=_hf_int(cfg, "num_key_value_heads", heads), ffn=_hf_int(cfg, "intermediate_size"),
                   rope_theta=float(theta), source="a transformers config")
    if mt == "qwen2" or cfg.get("attention_bias"):
        notes.append("the q/k/v projection biases are not built (a few thousand parameters a layer)")
    if cfg.get("mlp_bias"):
        notes.append("the MLP biases are not built")
    if cfg.get("tie_word_embeddings"):
        notes.append("the LM head is built untied from the embedding: its parameters are counted twice")
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        notes.append(f"sliding-window attention ({cfg.get('sliding_window')}) is priced as full causal attention")
    return m, notes
