"""``llama(...)``: a Llama language model as a weightless forward graph.

The graph is what ``import_torch`` of Hugging Face's ``LlamaForCausalLM`` gives: token
embedding, the rotary tables computed from the positions (no buffer), pre-norm blocks
(``rms_norm``; q, k, v projections by ``[out, in]`` weights without bias; rotary embedding;
grouped k/v heads repeated to the query heads; causal ``attention``; ``o_proj``; the SwiGLU
MLP ``down(silu(gate(x)) * up(x))``), the final norm and an untied LM head.
"""

from __future__ import annotations

import math

from ..ir.builder import Builder
from ..ir.dtypes import DType, f32, i64
from ..ir.graph import Graph, Value
from ..ir.types import TensorType
from ._build import ModelError, ScopedBuilder, check_positive, linear, model_dtype


def _rotate(b: Builder, x: Value, cos: Value, sin: Value, hd: int) -> Value:
    """``x * cos + rotate_half(x) * sin``, rotate_half as Llama's: ``concat(-x2, x1)``."""
    x1 = b.slice(x, axis=3, end=hd // 2)
    x2 = b.slice(x, axis=3, start=hd // 2)
    return b.add(b.mul(x, cos), b.mul(b.concat(b.neg(x2), x1, axis=3), sin))


def _repeat_kv(b: Builder, x: Value, rep: int, batch: int, kv_heads: int, seq: int, hd: int) -> Value:
    if rep == 1:
        return x
    x = b.broadcast_to(b.unsqueeze(x, axes=(2,)), shape=(batch, kv_heads, rep, seq, hd))
    return b.reshape(x, shape=(batch, kv_heads * rep, seq, hd))


def llama_ffn(hidden: int) -> int:
    """Llama's MLP width for ``hidden``: 8/3 of it, rounded up to a multiple of 256."""
    return 256 * math.ceil(int(8 * hidden / 3) / 256)


def llama(layers: int, hidden: int, heads: int, seq: int, vocab: int, kv_heads: int | None = None,
          ffn: int | None = None, batch: int = 1, dtype: str | DType = "bf16", *, eps: float = 1e-6,
          rope_theta: float = 10000.0, name: str = "llama") -> Graph:
    """The forward graph ``ids [batch, seq] i64 -> logits [batch, seq, vocab]`` of a Llama
    model; params are ``param`` inputs named as LlamaForCausalLM's state_dict, with no arrays.
    ``kv_heads``: k/v heads for grouped-query attention (``heads``); ``ffn``: the MLP width
    (``llama_ffn(hidden)``)."""
    kv_heads = heads if kv_heads is None else kv_heads
    ffn = llama_ffn(hidden) if ffn is None else ffn
    check_positive("llama", layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, batch=batch,
                   kv_heads=kv_heads, ffn=ffn)
    if hidden % heads or heads % kv_heads:
        raise ModelError(f"llama: hidden={hidden} must be a multiple of heads={heads}, and heads of "
                         f"kv_heads={kv_heads}")
    dt = model_dtype(dtype)
    hd, rep = hidden // heads, heads // kv_heads
    if hd % 2:
        raise ModelError(f"llama: the head size {hd} must be even for the rotary embedding")
    B, S, H, KV = batch, seq, hidden, kv_heads * (hidden // heads)
    g = Graph(name)
    sb = ScopedBuilder(g, "partita/models/llama.py")
    ids = sb.b.input("ids", TensorType((B, S), i64))
    embed = sb.param("model.embed_tokens.weight", (vocab, H), dt)
    x = sb.at("model.embed_tokens").embedding(embed, ids)

    # Rotary tables as Llama computes them: inv_freq = 1 / theta ** (arange(0, hd, 2) / hd).
    b = sb.at("model.rotary_emb")
    two_j = b.mul(b.cast(b.iota(shape=(hd // 2,)), dtype=f32), b.full(shape=(), value=2.0, dtype=f32))
    expo = b.div(two_j, b.full(shape=(), value=float(hd), dtype=f32))
    inv_freq = b.div(b.full(shape=(), value=1.0, dtype=f32), b.pow(b.full(shape=(), value=rope_theta, dtype=f32), expo))
    pos = b.unsqueeze(b.cast(b.iota(shape=(S,)), dtype=f32), axes=(1,))
    freqs = b.mul(pos, inv_freq)
    emb = b.concat(freqs, freqs, axis=1)
    cos = b.unsqueeze(b.cast(b.cos(emb), dtype=dt), axes=(0, 1))
    sin = b.unsqueeze(b.cast(b.sin(emb), dtype=dt), axes=(0, 1))

    for i in range(layers):
        s = f"model.layers.{i}"
        P = lambda n, shape: sb.param(f"{s}.{n}", shape, dt)  # noqa: E731
        h = sb.at(f"{s}.input_layernorm").rms_norm(x, P("input_layernorm.weight", (H,)), eps=eps)
        proj = {}
        for n, out, heads_n in (("q", H, heads), ("k", KV, kv_heads), ("v", KV, kv_heads)):
            b = sb.at(f"{s}.self_attn.{n}_proj")
            y = linear(b, b.reshape(h, shape=(B * S, H)), P(f"self_attn.{n}_proj.weight", (out, H)), None, True)
            y = b.reshape(y, shape=(B, S, out))
            b = sb.at(f"{s}.self_attn")
            proj[n] = b.transpose(b.reshape(y, shape=(B, S, -1, hd)), perm=(0, 2, 1, 3))
        b = sb.at(f"{s}.self_attn")
        q = _rotate(b, proj["q"], cos, sin, hd)
        k = _repeat_kv(b, _rotate(b, proj["k"], cos, sin, hd), rep, B, kv_heads, S, hd)
        v = _repeat_kv(b, proj["v"], rep, B, kv_heads, S, hd)
        out, _lse = b.attention(q, k, v, scale=1.0 / math.sqrt(hd), causal=True)
        att = b.reshape(b.transpose(out, perm=(0, 2, 1, 3)), shape=(B, S, -1))
        b = sb.at(f"{s}.self_attn.o_proj")
        o = linear(b, b.reshape(att, shape=(B * S, H)), P("self_attn.o_proj.weight", (H, H)), None, True)
        x = sb.at(s).add(x, b.reshape(o, shape=(B, S, H)))
        h = sb.at(f"{s}.post_attention_layernorm").rms_norm(x, P("post_attention_layernorm.weight", (H,)), eps=eps)
        b = sb.at(f"{s}.mlp.gate_proj")
        gate = b.reshape(linear(b, b.reshape(h, shape=(B * S, H)), P("mlp.gate_proj.weight", (ffn, H)), None, True),
                         shape=(B, S, ffn))
        gate = sb.at(f"{s}.mlp.act_fn").silu(gate)
        b = sb.at(f"{s}.mlp.up_proj")
        up = b.reshape(linear(b, b.reshape(h, shape=(B * S, H)), P("mlp.up_proj.weight", (ffn, H)), None, True),
                       shape=(B, S, ffn))
        m = sb.at(f"{s}.mlp").mul(gate, up)
        b = sb.at(f"{s}.mlp.down_proj")
        d = linear(b, b.reshape(m, shape=(B * S, ffn)), P("mlp.down_proj.weight", (H, ffn)), None, True)
        x = sb.at(s).add(x, b.reshape(d, shape=(B, S, H)))

    x = sb.at("model.norm").rms_norm(x, sb.param("model.norm.weight", (H,), dt), eps=eps)
    head = sb.param("lm_head.weight", (vocab, H), dt)
    b = sb.at("lm_head")
    logits = linear(b, b.reshape(x, shape=(B * S, H)), head, None, True)
    return b.ret(b.reshape(logits, shape=(B, S, vocab)))
