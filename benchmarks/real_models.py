"""Real models for the model suite, built from their libraries' own definitions
with random weights (nothing is downloaded): Hugging Face GPT-2, Llama and BERT
from configs, torchvision's ResNet-50 (`MODELS`, the suite issue 17 measures).

`HELD_OUT` are models no compiler change was tuned on, to check that a change
generalizes: Hugging Face T5 (encoder-decoder, relative position bias), Qwen2
(biased q/k/v, grouped-query attention), Mixtral (Llama's shape with a mixture of
8 experts, top-2 routing: topk, sort, a grouped expert matmul) and ViT; torchvision's MobileNetV3
(depthwise convolutions, hard-swish, squeeze-excitation), EfficientNet-B0 (SiLU),
ConvNeXt-T (7x7 depthwise, LayerNorm over channels-last) and Swin-T (shifted
windows: roll, window partition). `HELD_OUT_2`, added in the thirty-ninth session and
measured before any change was made for them: Hugging Face Phi (parallel attention and
MLP, partial rotary, gelu_new), Gemma (GeGLU, RMSNorm with a unit offset, one KV head),
BART (encoder-decoder, learned positions) and DeBERTa-v2 (disentangled relative
attention: gathers of position scores); torchvision's DenseNet-121 (a concatenation per
layer) and RegNetY-1.6GF (grouped convolutions, squeeze-excitation). Stochastic depth
and dropout are off.

`build(name, size)` gives a `ModelCase`: the module, a function making its
inputs, and the loss a training step backpropagates. `size` is "gpu" (the sizes
issue 17 measures: GPT-2 6 layers 8x512, Llama 6 layers 1024 wide 16/4 heads
4x512, BERT 6 layers 8x512, ResNet-50 32x224) or "cpu" (small configs, 2x128
tokens, that a 2-core machine runs in seconds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

MODELS = ("gpt2", "llama", "bert", "resnet50")
HELD_OUT = ("t5", "qwen2", "mixtral", "vit", "mobilenet_v3", "efficientnet", "convnext", "swin")
HELD_OUT_2 = ("phi", "gemma", "bart", "deberta_v2", "densenet121", "regnet_y_1_6gf")
VISION = ("resnet50", "vit", "mobilenet_v3", "efficientnet", "convnext", "swin", "densenet121", "regnet_y_1_6gf")
DECODERS = ("llama", "qwen2", "mixtral", "phi", "gemma")  # batch 4 x 512 on the GPU; the rest 8 x 512


@dataclass
class ModelCase:
    name: str
    module: torch.nn.Module
    make_inputs: Callable[[str], dict]  # device -> keyword arguments of forward
    loss: Callable[[Any, dict], torch.Tensor]  # (output, inputs) -> scalar
    label: str


def _no_dropout(module: torch.nn.Module) -> torch.nn.Module:
    """Dropout off, so compiled and eager steps compute the same function."""
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout) or type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return module


def with_dropout(module: torch.nn.Module, p: float) -> torch.nn.Module:
    """Every `nn.Dropout` at probability `p` (Hugging Face's configs default to 0.1;
    attention dropout reads its module's p too). Training steps then draw different
    numbers on every backend: their errors against eager mean nothing."""
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = p
    return module


def _tokens(vocab: int, batch: int, seq: int) -> Callable[[str], dict]:
    def make(device: str) -> dict:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        return {"input_ids": ids, "labels": ids}

    return make


def _hf_loss(out: Any, inputs: dict) -> torch.Tensor:
    return out.loss


def build(name: str, size: str = "gpu") -> ModelCase:
    torch.manual_seed(0)
    big = size == "gpu"
    if name in VISION:
        return _vision(name, big)
    import transformers

    layers = 6 if big else 2
    batch, seq = ((4 if name in DECODERS else 8), 512) if big else (2, 128)
    if name == "gpt2":
        vocab = 50257 if big else 5003
        cfg = transformers.GPT2Config(n_layer=layers, vocab_size=vocab, n_positions=1024, resid_pdrop=0.0,
                                      embd_pdrop=0.0, attn_pdrop=0.0,
                                      **({} if big else dict(n_embd=256, n_head=4)))
        module = transformers.GPT2LMHeadModel(cfg)
    elif name in ("llama", "qwen2"):  # one decoder shape: Qwen2 adds q/k/v biases
        vocab = 32000 if big else 5003
        config, model = ((transformers.LlamaConfig, transformers.LlamaForCausalLM) if name == "llama"
                         else (transformers.Qwen2Config, transformers.Qwen2ForCausalLM))
        module = model(config(num_hidden_layers=layers, hidden_size=1024 if big else 256,
                              num_attention_heads=16 if big else 4, num_key_value_heads=4 if big else 2,
                              intermediate_size=2816 if big else 688, vocab_size=vocab, max_position_embeddings=2048))
    elif name == "mixtral":
        vocab = 32000 if big else 5003
        module = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            num_hidden_layers=layers, hidden_size=1024 if big else 256, num_attention_heads=16 if big else 4,
            num_key_value_heads=4 if big else 2, intermediate_size=1408 if big else 344, num_local_experts=8,
            num_experts_per_tok=2, vocab_size=vocab, max_position_embeddings=2048))
    elif name in ("bert", "deberta_v2"):  # one encoder shape: DeBERTa-v2 adds disentangled attention
        vocab = (30522 if name == "bert" else 32000) if big else 5003
        config, model = ((transformers.BertConfig, transformers.BertForMaskedLM) if name == "bert"
                         else (transformers.DebertaV2Config, transformers.DebertaV2ForMaskedLM))
        module = model(config(num_hidden_layers=layers, vocab_size=vocab, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0,
                              **({} if big else dict(hidden_size=256, num_attention_heads=4, intermediate_size=1024))))
    elif name == "t5":
        vocab = 32128 if big else 5003
        cfg = transformers.T5Config(vocab_size=vocab, num_layers=layers, num_decoder_layers=layers, dropout_rate=0.0,
                                    decoder_start_token_id=0, pad_token_id=0,
                                    **(dict(d_model=512, d_kv=64, d_ff=2048, num_heads=8) if big
                                       else dict(d_model=256, d_kv=64, d_ff=1024, num_heads=4)))
        module = transformers.T5ForConditionalGeneration(cfg)
    elif name == "phi":
        vocab = 51200 if big else 5003
        module = transformers.PhiForCausalLM(transformers.PhiConfig(
            num_hidden_layers=layers, hidden_size=1024 if big else 256, num_attention_heads=16 if big else 4,
            intermediate_size=4096 if big else 1024, vocab_size=vocab, max_position_embeddings=2048,
            resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0))
    elif name == "gemma":
        vocab = 32000 if big else 5003
        module = transformers.GemmaForCausalLM(transformers.GemmaConfig(
            num_hidden_layers=layers, hidden_size=1024 if big else 256, num_attention_heads=8 if big else 4,
            num_key_value_heads=1, head_dim=128 if big else 64, intermediate_size=4096 if big else 1024,
            vocab_size=vocab, max_position_embeddings=2048))
    elif name == "bart":
        vocab = 50265 if big else 5003
        width, heads, ffn = (768, 12, 3072) if big else (256, 4, 1024)
        module = transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=vocab, d_model=width, encoder_layers=layers, decoder_layers=layers,
            encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0,
            decoder_layerdrop=0.0, max_position_embeddings=1024))
    else:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS + HELD_OUT + HELD_OUT_2)}")
    return ModelCase(name, _no_dropout(module), _tokens(vocab, batch, seq), _hf_loss,
                     f"HF {name} {layers}L {batch}x{seq}")


def _vision(name: str, big: bool) -> ModelCase:
    import torchvision

    batch, res = (32, 224) if big else (8, 96)  # small, but BatchNorm sees 72 values a channel at layer4
    if name == "vit":
        module = (torchvision.models.vit_b_16() if big else
                  torchvision.models.VisionTransformer(image_size=res, patch_size=16, num_layers=2, num_heads=4,
                                                       hidden_dim=256, mlp_dim=1024))
        torch.nn.init.normal_(module.heads.head.weight, std=0.02)  # torchvision zeroes it: outputs and gradients 0
    else:
        kw = {"stochastic_depth_prob": 0.0} if name in ("efficientnet", "convnext") else {}  # swin_t sets its own: _no_dropout
        module = {"resnet50": torchvision.models.resnet50, "mobilenet_v3": torchvision.models.mobilenet_v3_large,
                  "efficientnet": torchvision.models.efficientnet_b0, "convnext": torchvision.models.convnext_tiny,
                  "swin": torchvision.models.swin_t, "densenet121": torchvision.models.densenet121,
                  "regnet_y_1_6gf": torchvision.models.regnet_y_1_6gf}[name](**kw)

    def images(device: str) -> dict:
        g = torch.Generator().manual_seed(0)
        return {"x": torch.randn(batch, 3, res, res, generator=g).to(device)}

    def loss(out: Any, inputs: dict) -> torch.Tensor:
        return out.to(torch.promote_types(out.dtype, torch.float32)).square().mean()

    return ModelCase(name, _no_dropout(module), images, loss, f"{name} {batch}x3x{res}x{res}")
