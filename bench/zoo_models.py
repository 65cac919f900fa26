"""The zoo's architectures: small transformers configs with random weights, nothing downloaded.

Each ``ZooModel`` builds a module in eval mode (seeded, so every build gives the same
weights), the keyword inputs people pass (``inputs()``: tensors and Python constants such as
``use_cache=False``) and, for the training columns, the labels its own loss takes
(``labels()``; passed as ``labels=``). The first output of ``model(**inputs())`` is what the
inference columns compare (the logits); with ``labels=`` the first output is the loss.

Shapes are kept tiny (2 layers, 64 wide, batch 4, 8 tokens, 32 x 32 images) so that every
column of every model runs in minutes on two cores. The batch is 4 so that ``pp+dp`` with two
microbatches on ``pp=2,dp=2`` has one example per microbatch and rank.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from dataclasses import dataclass, field  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

V, B, S = 128, 4, 8          # vocab, batch, tokens
IMAGE, CLASSES = 32, 10
AUDIO = 640                   # raw samples of the speech models
FAMILIES = ("cnn", "vit", "decoder", "encoder", "seq2seq", "speech", "moe")


@dataclass
class ZooModel:
    """One architecture of the zoo."""

    name: str
    family: str
    build: Callable[[], nn.Module]
    inputs: Callable[[], dict[str, Any]]
    labels: Callable[[], torch.Tensor] | None = None
    moe: bool = False
    what: str = ""                          # what the architecture brings, for the table
    extra: dict[str, Any] = field(default_factory=dict)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensor inputs, by name, in call order."""
        return {k: v for k, v in self.inputs().items() if isinstance(v, torch.Tensor)}

    def constants(self) -> dict[str, Any]:
        """The non-tensor keyword inputs (``use_cache=False``, ...)."""
        return {k: v for k, v in self.inputs().items() if not isinstance(v, torch.Tensor)}


def gen(seed: int) -> torch.Generator:
    """A seeded generator: every input is the same at every call."""
    return torch.Generator().manual_seed(seed)


def ids() -> torch.Tensor:
    """Token ids [B, S] (no special tokens)."""
    return torch.randint(3, V, (B, S), generator=gen(1))


def mask() -> torch.Tensor:
    """An attention mask with the last example's last two tokens padded."""
    m = torch.ones(B, S, dtype=torch.int64)
    m[B - 1, S - 2:] = 0
    return m


def pixels(size: int = IMAGE) -> torch.Tensor:
    """Images [B, 3, size, size]."""
    return torch.randn(B, 3, size, size, generator=gen(3))


def classes() -> torch.Tensor:
    """Class labels [B]."""
    return torch.randint(0, CLASSES, (B,), generator=gen(5))


def audio() -> torch.Tensor:
    """Raw audio [B, AUDIO]."""
    return torch.randn(B, AUDIO, generator=gen(4))


def dec_ids() -> torch.Tensor:
    """Decoder token ids [B, 5] for the seq2seq models."""
    return torch.randint(3, V, (B, 5), generator=gen(2))


def transformers_module() -> Any:
    """transformers, imported on first use (slow to import)."""
    import transformers

    return transformers


def init_experts(model: nn.Module) -> None:
    """transformers leaves stacked expert weights as torch.empty: give them values."""
    g = gen(1)
    for m in model.modules():
        for name in ("gate_up_proj", "down_proj"):
            p = getattr(m, name, None)
            if isinstance(p, nn.Parameter) and p.dim() == 3:
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def perturb(model: nn.Module) -> nn.Module:
    """Weights that exercise every path: transformers initializes some to constants (norm
    scales 1, biases 0, zero classifiers and layer scales, BatchNorm statistics 0 and 1), and a
    zero classifier makes the logits 0 and every gradient before it 0. Noise on every param
    and random running statistics; deterministic (seeded)."""
    g = gen(7)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)) and m.running_mean is not None:
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) * 0.4 - 0.2)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model


def hf(cls: str, cfg: str, **kw: Any) -> Callable[[], nn.Module]:
    """A builder of ``transformers.<cls>(transformers.<cfg>(**kw))`` in eval mode, seeded,
    its weights perturbed (``perturb``)."""
    def build() -> nn.Module:
        t = transformers_module()
        torch.manual_seed(0)
        model = getattr(t, cls)(getattr(t, cfg)(**kw))
        init_experts(model)
        return perturb(model).eval()
    return build


def image_model(name: str, cls: str, cfg: str, family: str = "cnn", what: str = "", size: int = IMAGE,
                **kw: Any) -> ZooModel:
    """An image classifier (its own loss: cross-entropy over ``CLASSES`` classes)."""
    kw.setdefault("num_labels", CLASSES)
    return ZooModel(name, family, hf(cls, cfg, **kw), lambda: {"pixel_values": pixels(size)}, classes, what=what)


DEC = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           vocab_size=V, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def decoder(name: str, cls: str, cfg: str, what: str = "", moe: bool = False, **kw: Any) -> ZooModel:
    """A causal LM (its own loss: next-token cross-entropy on ``labels=input_ids``)."""
    return ZooModel(name, "moe" if moe else "decoder", hf(cls, cfg, **kw),
                    lambda: {"input_ids": ids(), "attention_mask": mask(), "use_cache": False}, ids, moe=moe,
                    what=what)


ENC = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=V,
           max_position_embeddings=64, pad_token_id=0)


def targets() -> torch.Tensor:
    """Random target tokens [B, S] for the masked LMs (a tied head predicts its own input
    token almost surely, so ``labels=input_ids`` would give a loss of about 0)."""
    return torch.randint(3, V, (B, S), generator=gen(6))


def encoder(name: str, cls: str, cfg: str, what: str = "", **kw: Any) -> ZooModel:
    """A masked LM (its own loss: cross-entropy on random ``labels=``)."""
    return ZooModel(name, "encoder", hf(cls, cfg, **kw), lambda: {"input_ids": ids(), "attention_mask": mask()},
                    targets, what=what)


def seq2seq(name: str, cls: str, cfg: str, what: str = "", **kw: Any) -> ZooModel:
    """An encoder-decoder LM (its own loss on ``labels=`` the decoder ids)."""
    return ZooModel(name, "seq2seq", hf(cls, cfg, **kw),
                    lambda: {"input_ids": ids(), "attention_mask": mask(), "decoder_input_ids": dec_ids(),
                             "use_cache": False}, dec_ids, what=what)


def speech(name: str, cls: str, cfg: str, what: str = "", **kw: Any) -> ZooModel:
    """An utterance classifier on raw audio (convolutional feature extractor, transformer)."""
    kw.setdefault("num_labels", CLASSES)
    return ZooModel(name, "speech", hf(cls, cfg, **kw), lambda: {"input_values": audio()}, classes, what=what)


class SqueezeExcite(nn.Module):
    """MobileNetV3's squeeze-excitation: pooled, reduced, hard-sigmoid gate."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: 1x1 expand, depthwise k x k, squeeze-excitation, 1x1 project."""

    def __init__(self, cin: int, cexp: int, cout: int, k: int, stride: int, se: bool) -> None:
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(cin, cexp, 1, bias=False), nn.BatchNorm2d(cexp), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(cexp, cexp, k, stride, k // 2, groups=cexp, bias=False),
                                nn.BatchNorm2d(cexp), nn.Hardswish())
        self.se = SqueezeExcite(cexp) if se else nn.Identity()
        self.project = nn.Sequential(nn.Conv2d(cexp, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y



class MobileNetV3(nn.Module):
    """A small MobileNetV3-like classifier (transformers has none): hard-swish, SE, depthwise
    5 x 5, with a loss when given ``labels=`` as the transformers classifiers do."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.blocks = nn.Sequential(InvertedResidual(16, 32, 16, 3, 1, True), InvertedResidual(16, 48, 24, 5, 2, True),
                                    InvertedResidual(24, 64, 24, 5, 1, False))
        self.head = nn.Sequential(nn.Linear(24, 64), nn.Hardswish(), nn.Linear(64, CLASSES))

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        h = self.blocks(self.stem(pixel_values))
        logits = self.head(h.mean((2, 3)))
        if labels is None:
            return (logits,)
        return F.cross_entropy(logits, labels), logits


def mobilenet_v3() -> nn.Module:
    """The MobileNetV3-like model, seeded, perturbed."""
    torch.manual_seed(0)
    return perturb(MobileNetV3()).eval()


def cnn_models() -> list[ZooModel]:
    """Convolutional networks, hybrids with attention included."""
    return [
        image_model("mobilenet_v1", "MobileNetV1ForImageClassification", "MobileNetV1Config", image_size=IMAGE,
                    depth_multiplier=0.25, what="depthwise conv, BN, ReLU6"),
        image_model("mobilenet_v2", "MobileNetV2ForImageClassification", "MobileNetV2Config", image_size=IMAGE,
                    depth_multiplier=0.35, what="inverted residuals, depthwise conv, BN"),
        image_model("mobilenet_v2_dilated", "MobileNetV2ForImageClassification", "MobileNetV2Config",
                    image_size=IMAGE, depth_multiplier=0.35, output_stride=8, what="dilated depthwise conv"),
        ZooModel("mobilenet_v3", "cnn", mobilenet_v3, lambda: {"pixel_values": pixels()}, classes,
                 what="hard-swish, SE with hard-sigmoid, depthwise 5x5 (plain torch)"),
        image_model("efficientnet", "EfficientNetForImageClassification", "EfficientNetConfig", image_size=IMAGE,
                    width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320, what="MBConv, SE, swish"),
        image_model("regnet", "RegNetForImageClassification", "RegNetConfig", embedding_size=16,
                    hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, layer_type="y",
                    what="grouped conv, SE"),
        image_model("resnet", "ResNetForImageClassification", "ResNetConfig", embedding_size=16,
                    hidden_sizes=[32, 64], depths=[1, 1], layer_type="bottleneck", what="bottleneck, BN"),
        image_model("bit", "BitForImageClassification", "BitConfig", embedding_size=16, hidden_sizes=[32, 64],
                    depths=[1, 1], layer_type="preactivation", num_groups=8,
                    what="weight-standardized conv, GroupNorm"),
        image_model("convnext", "ConvNextForImageClassification", "ConvNextConfig", num_stages=2,
                    hidden_sizes=[16, 32], depths=[1, 1], what="depthwise 7x7, LayerNorm channels-last, layer scale"),
        image_model("convnext_v2", "ConvNextV2ForImageClassification", "ConvNextV2Config", num_stages=2,
                    hidden_sizes=[16, 32], depths=[1, 1], what="global response norm"),
        image_model("poolformer", "PoolFormerForImageClassification", "PoolFormerConfig", num_encoder_blocks=2,
                    hidden_sizes=[16, 32], depths=[1, 1], patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1],
                    mlp_ratio=2.0, what="avg-pool mixer, GroupNorm"),
        image_model("mobilevit", "MobileViTForImageClassification", "MobileViTConfig", image_size=IMAGE,
                    hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 48], num_attention_heads=2,
                    what="unfold to patches, attention, fold"),
        image_model("mobilevit_v2", "MobileViTV2ForImageClassification", "MobileViTV2Config", image_size=64,
                    size=64, width_multiplier=0.25, what="separable linear attention, GroupNorm"),
    ]


VIT = dict(image_size=IMAGE, patch_size=8, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
           num_attention_heads=4)


def vit_models() -> list[ZooModel]:
    """Vision transformers."""
    return [
        image_model("vit", "ViTForImageClassification", "ViTConfig", "vit", what="patch embedding, CLS token", **VIT),
        image_model("deit", "DeiTForImageClassification", "DeiTConfig", "vit", what="distillation token", **VIT),
        image_model("beit", "BeitForImageClassification", "BeitConfig", "vit", use_relative_position_bias=True,
                    use_mean_pooling=True, layer_scale_init_value=0.1, what="relative position bias, layer scale",
                    **VIT),
        image_model("dinov2", "Dinov2ForImageClassification", "Dinov2Config", "vit", layerscale_value=0.5,
                    what="layer scale, interpolated position embedding", **VIT),
        image_model("swin", "SwinForImageClassification", "SwinConfig", "vit", image_size=IMAGE, patch_size=2,
                    embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4, what="shifted windows"),
        image_model("levit", "LevitForImageClassification", "LevitConfig", "vit", image_size=IMAGE,
                    hidden_sizes=[32, 48], num_attention_heads=[2, 3], depths=[1, 1], key_dim=[8, 8],
                    mlp_ratio=[2, 2], attention_ratio=[2, 2],
                    down_ops=[["Subsample", 8, 2, 4, 2, 2]], what="conv stem, attention bias, BN in linear"),
        image_model("pvt_v2", "PvtV2ForImageClassification", "PvtV2Config", "vit", image_size=IMAGE,
                    num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                    patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                    what="spatial-reduction attention, depthwise conv in the MLP"),
    ]


def decoder_models() -> list[ZooModel]:
    """Causal language models."""
    return [
        decoder("gpt2", "GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=64, n_head=4, vocab_size=V,
                n_positions=64, what="learned positions, tied head"),
        decoder("llama", "LlamaForCausalLM", "LlamaConfig", what="GQA, RoPE, RMSNorm", **DEC),
        decoder("mistral", "MistralForCausalLM", "MistralConfig", sliding_window=4, what="sliding window", **DEC),
        decoder("qwen2", "Qwen2ForCausalLM", "Qwen2Config", what="QKV bias", **DEC),
        decoder("qwen3", "Qwen3ForCausalLM", "Qwen3Config", head_dim=16, what="QK-norm", **DEC),
        decoder("gemma2", "Gemma2ForCausalLM", "Gemma2Config", head_dim=16, sliding_window=4,
                attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=16,
                what="logit soft-capping, alternating sliding window", **DEC),
        decoder("phi", "PhiForCausalLM", "PhiConfig", what="parallel attention+MLP, partial rotary",
                **{**DEC, "num_key_value_heads": 4}),
        decoder("phi3", "Phi3ForCausalLM", "Phi3Config", what="fused QKV and gate-up", **DEC),
        decoder("stablelm", "StableLmForCausalLM", "StableLmConfig", partial_rotary_factor=0.25,
                what="partial rotary, LayerNorm", **DEC),
        decoder("gptj", "GPTJForCausalLM", "GPTJConfig", n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                n_positions=64, vocab_size=V, what="interleaved partial rotary, parallel block, untied head"),
        decoder("codegen", "CodeGenForCausalLM", "CodeGenConfig", n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                n_positions=64, n_ctx=64, vocab_size=V, what="mixed-QKV layout, parallel block"),
        decoder("starcoder2", "Starcoder2ForCausalLM", "Starcoder2Config", sliding_window=4,
                what="GQA, biases, sliding window, GELU MLP", **DEC),
        decoder("olmo", "OlmoForCausalLM", "OlmoConfig", clip_qkv=8.0, what="non-parametric LayerNorm, QKV clip",
                **DEC),
        decoder("granite", "GraniteForCausalLM", "GraniteConfig", embedding_multiplier=2.0, logits_scaling=4.0,
                residual_multiplier=0.5, attention_multiplier=0.2, what="scaled embeddings, residuals, logits",
                **DEC),
        decoder("cohere", "CohereForCausalLM", "CohereConfig", logit_scale=0.5, use_qk_norm=False,
                what="parallel block, tied head, logit scale", **DEC),
        decoder("bloom", "BloomForCausalLM", "BloomConfig", hidden_size=64, n_layer=2, n_head=4, vocab_size=V,
                what="ALiBi"),
        decoder("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", rotary_pct=0.25, use_parallel_residual=True,
                what="parallel residual, partial rotary", **{**DEC, "num_key_value_heads": 4}),
    ]


def encoder_models() -> list[ZooModel]:
    """Bidirectional encoders."""
    return [
        encoder("bert", "BertForMaskedLM", "BertConfig", what="absolute positions, token types", **ENC),
        encoder("deberta_v2", "DebertaV2ForMaskedLM", "DebertaV2Config", relative_attention=True,
                pos_att_type=["p2c", "c2p"], position_buckets=16, max_relative_positions=32, type_vocab_size=0,
                what="disentangled attention", **ENC),
        encoder("electra", "ElectraForMaskedLM", "ElectraConfig", embedding_size=32, what="embedding projection",
                **ENC),
        encoder("mpnet", "MPNetForMaskedLM", "MPNetConfig",
                what="relative position buckets", **{**ENC, "pad_token_id": 1, "max_position_embeddings": 72}),
        encoder("xlm_roberta", "XLMRobertaForMaskedLM", "XLMRobertaConfig", what="padding-offset positions",
                **{**ENC, "pad_token_id": 1, "max_position_embeddings": 72}),
        encoder("funnel", "FunnelForMaskedLM", "FunnelConfig", vocab_size=V, d_model=64, n_head=4, d_head=16,
                d_inner=128, block_sizes=[1, 1], num_decoder_layers=1, what="sequence pooling, upsampling"),
    ]


def other_models() -> list[ZooModel]:
    """Seq2seq, speech and mixtures of experts."""
    return [
        seq2seq("t5", "T5ForConditionalGeneration", "T5Config", vocab_size=V, d_model=64, d_kv=16, d_ff=128,
                num_layers=2, num_heads=4, decoder_start_token_id=0, what="relative bias buckets, RMSNorm"),
        seq2seq("bart", "BartForConditionalGeneration", "BartConfig", vocab_size=V, d_model=64, encoder_layers=2,
                decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                decoder_ffn_dim=128, max_position_embeddings=64, what="cross-attention, learned positions"),
        speech("wav2vec2", "Wav2Vec2ForSequenceClassification", "Wav2Vec2Config", hidden_size=64,
               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, conv_dim=(16, 16, 16),
               conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=8,
               num_conv_pos_embedding_groups=4, classifier_proj_size=32, mask_time_prob=0.0,
               what="conv feature extractor, GroupNorm, grouped positional conv"),
        speech("hubert", "HubertForSequenceClassification", "HubertConfig", hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2),
               conv_kernel=(10, 3, 3), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
               classifier_proj_size=32, mask_time_prob=0.0, feat_extract_norm="layer", do_stable_layer_norm=True,
               what="conv feature extractor with LayerNorm, pre-norm"),
        decoder("mixtral", "MixtralForCausalLM", "MixtralConfig", moe=True, num_local_experts=4,
                num_experts_per_tok=2, what="top-2 of 4 experts", **DEC),
        decoder("qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig", moe=True, moe_intermediate_size=32,
                shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                what="shared expert, top-2 of 4", **DEC),
    ]


MODELS: list[ZooModel] = cnn_models() + vit_models() + decoder_models() + encoder_models() + other_models()
BY_NAME: dict[str, ZooModel] = {m.name: m for m in MODELS}
