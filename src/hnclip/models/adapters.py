"""LoRA / DoRA adapters (peft) on open_clip `CLIP` models, for the paper's LoRA and DoRA baselines.

Two open_clip facts shape this module:
1. The default blocks use `nn.MultiheadAttention`, which reads `out_proj.weight` functionally (an
   adapter wrapped around `out_proj` never gets a gradient) and which peft cannot DoRA-adapt. So the
   towers are rebuilt with open_clip's custom blocks (`block_type="custom"`, `transformer.Attention`),
   which load the same state dict.
2. The custom `Attention` still keeps q/k/v as one raw `in_proj_weight` Parameter, not a Linear, and
   peft's `target_parameters` (its route for raw Parameters) refuses DoRA. So each attention's
   in-projection is split into `q_proj`/`k_proj`/`v_proj` Linears (`SplitQKVAttention`), giving
   every attention projection its own adapter, as LoRA on HF CLIP (q/k/v/out_proj) does.

Targets: q_proj, k_proj, v_proj, out_proj, mlp.c_fc, mlp.c_proj of every block in both towers.
Everything else (embeddings, norms, final projections, logit_scale) stays frozen.
`merge_adapters` folds the adapters in and returns a plain open_clip `CLIP` (default blocks, standard
state-dict keys) for evaluation, leaving the training model untouched.
"""
from __future__ import annotations

import copy
import dataclasses
import re

import torch
import torch.nn.functional as F
from open_clip.model import CLIP
from open_clip.transformer import Attention, QuickGELU
from peft import (
    LoraConfig,
    PeftModel,
    get_peft_model,
    get_peft_model_state_dict,
    set_peft_model_state_dict,
)
from torch import nn

from hnclip.config.constants import ADAPTER_FRAMEWORKS, DEFAULT_ADAPTER
from hnclip.models.longclip import (
    OpenAIArchitecture,
    build_clip,
    infer_architecture,
    load_state_dict_strictly,
)

_LAYERS = r"\.resblocks\.\d+\.(attn\.(q_proj|k_proj|v_proj|out_proj)|mlp\.(c_fc|c_proj))"
TARGETS = {  # peft regex (full match against module names)
    "both": rf"(visual\.)?transformer{_LAYERS}",
    "text": rf"transformer{_LAYERS}",
    "vision": rf"visual\.transformer{_LAYERS}",
}


# ---------------------------------------------------------------------------------------------
# Attention whose q/k/v projections are separate Linears
# ---------------------------------------------------------------------------------------------

class SplitQKVAttention(nn.Module):
    """open_clip `transformer.Attention` (plain config) with q/k/v as three `nn.Linear`s.

    Numerically the same attention: the fused in-projection's row blocks become q/k/v weights.
    """

    def __init__(self, attention: Attention):
        super().__init__()
        _require_plain_attention(attention)
        dim = attention.out_proj.in_features
        self.num_heads = attention.num_heads
        has_bias = attention.in_proj_bias is not None
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(dim, dim, bias=has_bias) for _ in range(3))
        with torch.no_grad():
            for projection, weight in zip(self.projections(), attention.in_proj_weight.chunk(3)):
                projection.weight.copy_(weight)
            if has_bias:
                for projection, bias in zip(self.projections(), attention.in_proj_bias.chunk(3)):
                    projection.bias.copy_(bias)
        self.out_proj = attention.out_proj
        self.attn_drop = attention.attn_drop
        self.out_drop = attention.out_drop
        self.to(attention.in_proj_weight)

    def projections(self) -> tuple[nn.Linear, nn.Linear, nn.Linear]:
        return self.q_proj, self.k_proj, self.v_proj

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.reshape(batch, length, self.num_heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (self._split_heads(projection(x)) for projection in self.projections())
        if attn_mask is not None:
            attn_mask = _additive_mask(attn_mask, batch, self.num_heads, length, q.dtype)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                           dropout_p=self.attn_drop.p if self.training else 0.0)
        x = x.transpose(1, 2).reshape(batch, length, width)
        return self.out_drop(self.out_proj(x))


def _require_plain_attention(attention: Attention) -> None:
    # CLIP/Long-CLIP use none of open_clip's attention extras; refuse rather than silently drop them.
    extras = {
        "scaled_cosine": attention.logit_scale is not None,
        "scale_heads": attention.head_scale is not None,
        "qk_norm": not isinstance(attention.ln_q, nn.Identity),
        "inner_norm": not isinstance(attention.ln_inner, nn.Identity),
    }
    used = [name for name, on in extras.items() if on]
    if used:
        raise NotImplementedError(f"attention features not supported by SplitQKVAttention: {used}")


def _additive_mask(mask: torch.Tensor, batch: int, heads: int, length: int, dtype: torch.dtype) -> torch.Tensor:
    # Same conventions as open_clip's Attention: bool True = masked, 3-D masks are per (batch*head).
    if mask.ndim == 3:
        mask = mask.reshape(batch, heads, length, length)
    if mask.dtype == torch.bool:
        return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


# ---------------------------------------------------------------------------------------------
# Rebuilding open_clip CLIPs with other block types
# ---------------------------------------------------------------------------------------------

def _resblocks(model: CLIP) -> list[nn.Module]:
    return [*model.visual.transformer.resblocks, *model.transformer.resblocks]


def _uses_quick_gelu(model: CLIP) -> bool:
    return isinstance(model.transformer.resblocks[0].mlp.gelu, QuickGELU)


def architecture_of(model: CLIP) -> OpenAIArchitecture:
    """The model's shape, with head counts read from its modules (they are not in the weights)."""
    if not isinstance(model, CLIP):
        raise TypeError(f"expected an open_clip CLIP, got {type(model).__name__}")
    state_dict = model.state_dict()
    if "transformer.resblocks.0.attn.q_proj.weight" in state_dict:
        state_dict = fuse_qkv_state_dict(state_dict)
    return dataclasses.replace(
        infer_architecture(state_dict, head_width=1),  # head_width 1 always divides; heads set below
        vision_heads=model.visual.transformer.resblocks[0].attn.num_heads,
        text_heads=model.transformer.resblocks[0].attn.num_heads,
    )


def _rebuild(model: CLIP, state_dict: dict, block_type: str | None) -> CLIP:
    reference = next(model.parameters())
    rebuilt = build_clip(architecture_of(model), quick_gelu=_uses_quick_gelu(model), block_type=block_type)
    load_state_dict_strictly(rebuilt, state_dict)
    return rebuilt.to(device=reference.device, dtype=reference.dtype).train(model.training)


def _probe_max_difference(model_a: CLIP, model_b: CLIP) -> float:
    """Largest feature difference of the two models on one random image and one random text."""
    reference = next(model_a.parameters())
    generator = torch.Generator().manual_seed(0)
    size = model_a.visual.image_size
    image = torch.randn(1, 3, *size, generator=generator).to(reference)
    text = torch.randint(1, model_a.vocab_size - 1, (1, model_a.context_length), generator=generator)
    text[0, -1] = model_a.vocab_size - 1  # EOT (the largest id) last, as argmax pooling expects
    text = text.to(reference.device)
    modes = model_a.training, model_b.training
    model_a.eval(), model_b.eval()
    try:
        with torch.no_grad():
            diffs = [(model_a.encode_image(image) - model_b.encode_image(image)).abs().max(),
                     (model_a.encode_text(text) - model_b.encode_text(text)).abs().max()]
    finally:
        model_a.train(modes[0]), model_b.train(modes[1])
    return float(max(diffs))


def to_custom_blocks(model: CLIP, verify: bool = True, atol: float = 1e-5) -> CLIP:
    """The same CLIP rebuilt with open_clip's custom blocks (`block_type="custom"`), same weights.

    `verify` compares both models on one probe input (a forward pass each) and raises on a difference.
    """
    custom = _rebuild(model, model.state_dict(), block_type="custom")
    if verify:
        difference = _probe_max_difference(model, custom)
        if difference > atol:
            raise RuntimeError(f"custom-block rebuild changed the outputs by {difference:.3g} (> {atol})")
    return custom


def split_qkv(model: CLIP) -> CLIP:
    """Replace every custom-block `Attention` with `SplitQKVAttention`, in place."""
    for block in _resblocks(model):
        if not isinstance(block.attn, (Attention, SplitQKVAttention)):
            raise TypeError("split_qkv needs custom blocks; call to_custom_blocks first")
        if isinstance(block.attn, Attention):
            block.attn = SplitQKVAttention(block.attn)
    return model


def fuse_qkv_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Standard open_clip keys: `attn.{q,k,v}_proj.{weight,bias}` -> `attn.in_proj_{weight,bias}`."""
    fused: dict[str, torch.Tensor] = {}
    pattern = re.compile(r"^(?P<prefix>.*\.attn\.)(?P<which>[qkv])_proj\.(?P<kind>weight|bias)$")
    parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for key, value in state_dict.items():
        match = pattern.match(key)
        if match is None:
            fused[key] = value
        else:
            parts.setdefault((match["prefix"], match["kind"]), {})[match["which"]] = value
    for (prefix, kind), qkv in parts.items():
        fused[f"{prefix}in_proj_{kind}"] = torch.cat([qkv["q"], qkv["k"], qkv["v"]], dim=0)
    return fused


def prepare_for_adapters(model: CLIP) -> CLIP:
    """A copy of `model` with custom blocks and split q/k/v (the input model is not modified)."""
    already_custom = all(isinstance(b.attn, (Attention, SplitQKVAttention)) for b in _resblocks(model))
    prepared = copy.deepcopy(model) if already_custom else to_custom_blocks(model)
    return split_qkv(prepared)


# ---------------------------------------------------------------------------------------------
# Adapters
# ---------------------------------------------------------------------------------------------

def apply_adapters(model: CLIP, kind: str, r: int = DEFAULT_ADAPTER["r"], alpha: float = DEFAULT_ADAPTER["alpha"],
                   dropout: float = DEFAULT_ADAPTER["dropout"], target: str | list[str] = DEFAULT_ADAPTER["target"]
                   ) -> PeftModel:
    """Wrap `model` (not modified) with LoRA or DoRA adapters; only adapter weights are trainable.

    target: "both" | "text" | "vision" (q/k/v/out + MLP Linears of every block of those towers), or
    a peft `target_modules` regex / list of names. Defaults: `hnclip.config.constants.DEFAULT_ADAPTER`.
    """
    if kind not in ADAPTER_FRAMEWORKS:
        raise ValueError(f"unknown adapter kind {kind!r}; expected one of {ADAPTER_FRAMEWORKS}")
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=TARGETS.get(target, target) if isinstance(target, str) else list(target),
        use_dora=kind == "dora",
        bias="none",
    )
    return get_peft_model(prepare_for_adapters(model), config)


def adapter_parameters(peft_model: PeftModel) -> dict[str, nn.Parameter]:
    """The trainable adapter parameters (LoRA A/B and, for DoRA, the magnitude vectors)."""
    return {name: param for name, param in peft_model.named_parameters() if param.requires_grad}


def adapter_state_dict(peft_model: PeftModel) -> dict[str, torch.Tensor]:
    """Only the adapter weights (for training checkpoints); reload with `load_adapter_state_dict`."""
    return {key: value.detach().clone() for key, value in get_peft_model_state_dict(peft_model).items()}


def load_adapter_state_dict(peft_model: PeftModel, state_dict: dict[str, torch.Tensor]) -> None:
    """Restore adapter weights saved by `adapter_state_dict`; raises if any adapter key is left out."""
    result = set_peft_model_state_dict(peft_model, state_dict)
    missing = [key for key in result.missing_keys if "lora_" in key]
    if missing or result.unexpected_keys:
        raise KeyError(f"adapter state dict mismatch: missing {missing}, unexpected {result.unexpected_keys}")


def merge_adapters(peft_model: PeftModel) -> CLIP:
    """A plain open_clip `CLIP` (default blocks, standard keys) with the adapters merged in.

    Works on a copy, so a model in training keeps its adapters (evaluate every epoch, go on training).
    """
    merged = copy.deepcopy(peft_model).merge_and_unload()
    plain = _rebuild(merged, fuse_qkv_state_dict(merged.state_dict()), block_type=None)
    return plain.eval()
