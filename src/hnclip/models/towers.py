"""Forward passes of an open_clip `CLIP` that also return projected token features.

Text sequences are trimmed to the longest non-padding sequence of the batch before the
transformer: the causal mask means trailing padding never influences earlier positions, so the
pooled (EOT) features equal `model.encode_text` on the full 248-token input while costing
O(longest caption) instead of O(context length).

The text transformer runs with attention's causal flag (`text_transformer`) instead of open_clip's
float -inf mask wherever its blocks are open_clip's default `ResidualAttentionBlock`s (full fine-tuning,
evaluation): `nn.MultiheadAttention` then hands `is_causal=True` and no mask to
`F.scaled_dot_product_attention`, which can use its flash and memory-efficient kernels (a float mask
rules the flash kernel out). The mask is the same causal mask, so the result is the same up to float
rounding (tests/test_towers.py). Other blocks (the adapter runs' custom blocks) keep the float mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from open_clip.transformer import ResidualAttentionBlock
from torch.utils.checkpoint import checkpoint

from hnclip.config.constants import PAD_ID


@dataclass
class Encoded:
    image_features: torch.Tensor | None = None      # [B, E], L2-normalized
    text_features: torch.Tensor | None = None       # [B, E], L2-normalized
    image_tokens: torch.Tensor | None = None        # [B, P, E], projected (not normalized)
    text_tokens: torch.Tensor | None = None         # [B, T, E], projected (not normalized)
    text_padding_mask: torch.Tensor | None = None   # [B, T], True at padding


def text_length(tokens: torch.Tensor) -> int:
    """Positions a text forward must keep so every sequence keeps its EOT: up to the batch's last EOT
    (each row's highest id). Not the count of non-padding ids: id 0 is also BPE '!' (as in "reads
    'OPEN!'."), so such a caption would lose its EOT. Every trimmed text forward uses this rule."""
    return max(int(tokens.argmax(dim=-1).max().item()) + 1, 1)


def trim_padding(tokens: torch.Tensor) -> torch.Tensor:
    return tokens[:, : text_length(tokens)]


def _causal_block(block: ResidualAttentionBlock, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """open_clip's `ResidualAttentionBlock.forward` (self-attention) with the causal flag. The mask still
    goes in: `nn.MultiheadAttention` requires it with the flag, uses it on its inference fast path, and
    otherwise drops it for the flag (`F.multi_head_attention_forward`: is_causal, no key padding mask,
    need_weights False -> SDPA with attn_mask None, is_causal True)."""
    h = block.ln_1(x)
    x = x + block.ls_1(block.attn(h, h, h, need_weights=False, attn_mask=mask.to(h.dtype), is_causal=True)[0])
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def uses_causal_flag(transformer) -> bool:
    """Whether `text_transformer` runs this text transformer with the causal flag: batch-first default
    open_clip blocks (plain self-attention), not the custom blocks adapter runs are rebuilt with."""
    return bool(transformer.batch_first) and all(
        type(block) is ResidualAttentionBlock and not hasattr(block, "ln_1_kv") for block in transformer.resblocks)


def text_transformer(model, x: torch.Tensor) -> torch.Tensor:
    """`model.transformer(x, attn_mask=causal mask)` for embedded tokens x [B, L, width], with the causal
    flag where the blocks allow it (`uses_causal_flag`); gradient checkpointing as open_clip applies it."""
    length = x.shape[1]
    mask = model.attn_mask[:length, :length]
    transformer = model.transformer
    if not uses_causal_flag(transformer):
        return transformer(x, attn_mask=mask)
    run_block = getattr(model, COMPILED_BLOCK, None) or _causal_block
    for block in transformer.resblocks:
        if transformer.grad_checkpointing and torch.is_grad_enabled():
            x = checkpoint(run_block, block, x, mask, use_reentrant=False)
        else:
            x = run_block(block, x, mask)
    return x


COMPILED_BLOCK = "_hnclip_compiled_text_block"  # where `compile_towers` keeps the compiled causal block


def compile_towers(model, backend: str = "inductor") -> None:
    """`torch.compile` both towers in place (execution.compile): the image tower's forward and every text
    block, as `text_transformer` runs them (the causal block function, compiled once with dynamic shapes
    since each batch is trimmed to its own length; or each custom block's own forward). `nn.Module.compile`
    leaves parameters and state-dict keys as they are, so checkpoints and exports do not change. `backend`:
    torch.compile's (tests trace with "eager")."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model's CLIP
    base.visual.compile(backend=backend)
    if uses_causal_flag(base.transformer):
        setattr(base, COMPILED_BLOCK, torch.compile(_causal_block, dynamic=True, backend=backend))
    else:
        for block in base.transformer.resblocks:
            block.compile(dynamic=True, backend=backend)


def encode_text(model, tokens: torch.Tensor, with_tokens: bool = False):
    tokens = trim_padding(tokens)
    length = tokens.shape[1]
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens).to(cast_dtype)
    x = x + model.positional_embedding[:length].to(cast_dtype)
    x = text_transformer(model, x)
    x = model.ln_final(x)
    pooled = x[torch.arange(x.shape[0], device=x.device), tokens.argmax(dim=-1)]
    pooled = pooled @ model.text_projection
    if not with_tokens:
        return F.normalize(pooled, dim=-1)
    return F.normalize(pooled, dim=-1), x @ model.text_projection, tokens == PAD_ID


def encode_image(model, images: torch.Tensor, with_tokens: bool = False):
    visual = model.visual
    if not with_tokens:
        return F.normalize(visual(images), dim=-1)
    previous = visual.output_tokens
    visual.output_tokens = True
    try:
        pooled, tokens = visual(images)
    finally:
        visual.output_tokens = previous
    return F.normalize(pooled, dim=-1), tokens @ visual.proj


def encode_batch(model, images: torch.Tensor, tokens: torch.Tensor, with_tokens: bool) -> Encoded:
    if not with_tokens:
        return Encoded(image_features=encode_image(model, images), text_features=encode_text(model, tokens))
    img, img_tok = encode_image(model, images, with_tokens=True)
    txt, txt_tok, pad = encode_text(model, tokens, with_tokens=True)
    return Encoded(img, txt, img_tok, txt_tok, pad)
