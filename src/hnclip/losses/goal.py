"""GOAL's training objective (Choi et al., CVPR'25) on an open_clip CLIP, with its released quirks as settings.

One step sees B originals (image I, caption Tx) and, per original, its max-similarity SAM segment (crop I_s,
matched sentence Tx_s, bbox of the crop in the original image). With v, t the normalised global features:

    L = L_org + 0.5 * L_seg + L_patch + L_text
    L_org   = CLIP loss on the B original pairs; the HN plug-and-play swap makes it L_HN (paper D.2)
    L_seg   = CLIP loss (InfoNCE) on the B segment pairs, never swapped
    L_patch = mean_b (u_b . v_s,b - 1)^2,  u = n(proj_v(LN_post(mean of the box's last-layer image tokens)))
    L_text  = mean_b (w_b . t_s,b - 1)^2,  w = n(proj_t(LN_final(mean of the sentence's last-layer text tokens)))

n(x) = (x + 1e-8) / ||x + 1e-8|| everywhere, as released. Last-layer tokens are the transformer outputs before
the final LayerNorm, so LN + projection map the pooled token into the joint space like the CLS / EOT token.

Quirks of the released code (goal_loss_finetuning.py @34f018e), each a `GoalSettings` field:
- `patch_size_bug`: box indices are computed on a 16-px grid whatever the model's patch size, then read from
  the real token sequence (for ViT-L/14: a 14-wide grid read on the 16x16 map, i.e. the wrong tokens).
- `box_scale="crop"`: the box is scaled by the crop's own width/height instead of the image's, so it
  collapses to the last patch row/column unless the crop touches the left/top border.
- `late_by_one`: the sentence's token span starts one token late (its first token lost, the next '.' gained).
- `double_forward`: both encoders run twice per step. The second forward (the hidden states) runs outside
  the release's autocast context, in fp32: under bf16 autocast it always runs, as released; in an fp32 run
  it gives the first forward's values, so there it is cost only.

The corrected box geometry, `box_scale="center_crop"`, maps the box through the image tower's own shortest-side
resize and centre crop (`view_box`), so the selected patches are those the segment covers on a non-square
image; `box_scale="image"` scales by the image's W, H into the square (no crop geometry).
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from hnclip.config.objective_keys import g_source
from hnclip.losses.distributed import global_infonce_loss
from hnclip.losses.objective import as_float32, contrastive_terms, trained_term
from hnclip.models.towers import text_length

EPS = 1e-8  # GOAL's n(x) shifts by 1e-8 before normalising
RELEASED_PATCH_SIZE = 16  # goal_loss_finetuning.py passes patch_size=16 for every backbone
BOX_SCALES = ("crop", "image", "center_crop")
Autocast = Callable[[], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class GoalSettings:
    """GOAL's protocol settings; the defaults reproduce the released code (quirks on, official weights)."""

    patch_size_bug: bool = True   # box -> tokens on a 16-px grid whatever the patch size
    box_scale: str = "crop"       # "crop": scale by the crop's w,h (released); "image": by the image's W,H;
                                  # "center_crop": through the image tower's resize and centre crop
    late_by_one: bool = True      # sentence span starts one token late (released)
    double_forward: bool = True   # run both encoders twice per step (released); cost only in fp32 runs: under
                                  # autocast the second (fp32) forward always runs, as released
    seg_weight: float = 0.5
    patch_weight: float = 1.0
    text_weight: float = 1.0

    def __post_init__(self):
        if self.box_scale not in BOX_SCALES:
            raise ValueError(f"box_scale must be one of {BOX_SCALES}, got {self.box_scale!r}")

    @classmethod
    def from_dict(cls, values: Mapping) -> GoalSettings:
        """From a params mapping; an unknown key is an error, not silently ignored."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown GOAL settings: {sorted(unknown)}")
        return cls(**values)


# ---- box -> patch tokens ------------------------------------------------------------------------------

def _scaled(value: float, extent: float, grid_image_size: int) -> int:
    # Python's round (half to even) on (value * S) / extent: the released arithmetic, bit for bit.
    return round(value * grid_image_size / extent)


def _patch_range(low: int, high: int, patch: int) -> range:
    """Patches touched by pixels [low, high): floor(low/p) .. ceil(high/p) - 1, widened to one patch if empty."""
    first, stop = low // patch, -(-high // patch)
    # The released code averages an empty selection (NaN loss); a degenerate box keeps its one patch instead.
    return range(first, max(stop, first + 1))


def view_box(box: Mapping[str, float], image_size: tuple[int, int], side: int) -> tuple[float, ...]:
    """(x1, y1, x2, y2) of a box of the W x H image in the S x S view the image tower sees: the shortest side
    resized to S (long side int(S * long / short), torchvision's `Resize(S)`), then the centre S x S crop
    (offset int(round((new - S) / 2)), torchvision's `CenterCrop`), clipped to the crop (what it cuts off
    is dropped). Coordinates are continuous pixel edges, not rounded."""
    width, height = image_size
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width} x {height}")
    short, long = min(width, height), max(width, height)
    new_long = int(side * long / short)
    new_w, new_h = (side, new_long) if width <= height else (new_long, side)
    left, top = int(round((new_w - side) / 2.0)), int(round((new_h - side) / 2.0))

    def mapped(value: float, scale: float, offset: int) -> float:
        # 1e-6 px absorbs float noise, so an edge on a patch border does not touch the next patch
        return round(min(max(value * scale - offset, 0.0), float(side)), 6)
    return (mapped(box["x1"], new_w / width, left), mapped(box["y1"], new_h / height, top),
            mapped(box["x2"], new_w / width, left), mapped(box["y2"], new_h / height, top))


def _view_patch_range(low: float, high: float, patch: int, side: int) -> range:
    """Patches whose pixels meet [low, high) of the view; a box the crop cut to nothing keeps its border patch."""
    first = min(math.floor(low / patch), side // patch - 1)
    return range(first, max(math.ceil(high / patch), first + 1))


def box_to_patch_indices(box: Mapping[str, float], image_size: tuple[int, int], grid_image_size: int,
                         patch_size: int, *, patch_size_bug: bool, box_scale: str) -> torch.Tensor:
    """Token indices (CLS = 0, patches from 1, row-major) of the ViT patches a segment's bbox covers.

    `box` holds x1, y1, x2, y2 in pixels of the original image and width, height = the crop's size;
    `image_size` = (W, H) of the original image; `grid_image_size` = S, the model's input side; `patch_size` =
    the model's real patch size. Coordinates are mapped to the S x S input by scaling (no centre-crop
    geometry, as released), x1, y1 clipped to [0, S-1] and x2, y2 to [0, S] (the released clipping, which keeps
    a box pushed past the border on the last patch). With `patch_size_bug` the rows/columns and the index
    arithmetic use p = 16 and a grid S // 16 wide, and those indices are returned unchanged to be read from the
    real token sequence; an index past the real sequence (only possible when the real patch is > 16 px) raises,
    as the released indexing would.

    `box_scale="center_crop"` (the corrected geometry) instead maps the box through the image tower's own
    resize and centre crop (`view_box`) and selects every patch the mapped box meets, so on a non-square
    image the tokens are those the segment really covers; the part the crop cuts off is dropped.
    """
    if box_scale == "center_crop":
        patch = RELEASED_PATCH_SIZE if patch_size_bug else patch_size
        if grid_image_size % patch:
            raise ValueError(f"input side {grid_image_size} is not a multiple of the patch size {patch}")
        x1, y1, x2, y2 = view_box(box, image_size, grid_image_size)
        width = grid_image_size // patch
        indices = torch.tensor([r * width + c + 1 for r in _view_patch_range(y1, y2, patch, grid_image_size)
                                for c in _view_patch_range(x1, x2, patch, grid_image_size)], dtype=torch.long)
        return _checked(indices, grid_image_size, patch_size)
    if box_scale == "crop":
        extent_w, extent_h = box["width"], box["height"]
    elif box_scale == "image":
        extent_w, extent_h = image_size
    else:
        raise ValueError(f"box_scale must be one of {BOX_SCALES}, got {box_scale!r}")
    if extent_w <= 0 or extent_h <= 0:
        raise ValueError(f"box scale extent must be positive, got {extent_w} x {extent_h}")
    side = grid_image_size
    x1 = min(max(_scaled(box["x1"], extent_w, side), 0), side - 1)
    y1 = min(max(_scaled(box["y1"], extent_h, side), 0), side - 1)
    x2 = min(max(_scaled(box["x2"], extent_w, side), 0), side)
    y2 = min(max(_scaled(box["y2"], extent_h, side), 0), side)
    patch = RELEASED_PATCH_SIZE if patch_size_bug else patch_size
    if side % patch:
        raise ValueError(f"input side {side} is not a multiple of the patch size {patch}")
    width = side // patch
    indices = torch.tensor([r * width + c + 1 for r in _patch_range(y1, y2, patch)
                            for c in _patch_range(x1, x2, patch)], dtype=torch.long)
    return _checked(indices, side, patch_size)


def _checked(indices: torch.Tensor, side: int, patch_size: int) -> torch.Tensor:
    num_patches = (side // patch_size) ** 2
    if int(indices.max()) > num_patches:
        raise ValueError(f"box indices up to {int(indices.max())} exceed the model's {num_patches} patch tokens")
    return indices


def patch_mask(indices: Sequence[Sequence[int] | torch.Tensor], num_tokens: int) -> torch.Tensor:
    """[B, num_tokens] bool mask, True at each sample's selected token indices (num_tokens = patches + CLS)."""
    mask = torch.zeros(len(indices), num_tokens, dtype=torch.bool)
    for row, sample in enumerate(indices):
        mask[row, torch.as_tensor(sample, dtype=torch.long)] = True
    return mask


# ---- sentence -> text tokens --------------------------------------------------------------------------

def caption_sentences(caption: str) -> list[str]:
    """GOAL's sentences: the whitespace-normalised caption split on '.', each stripped, empties dropped."""
    return [s.strip() for s in " ".join(caption.split()).split(".") if s.strip()]


def sentence_index(caption: str, sentence: str) -> int:
    """Index of the first of the caption's sentences equal to `sentence` (whitespace-normalised).

    Raises ValueError when absent: LISM sentences come from the caption's own split, so the released
    fallback (a character-position prefix) is not reproduced.
    """
    return caption_sentences(caption).index(" ".join(sentence.split()))


def sentence_token_span(caption: str, sentence_index: int, tokenizer_fn: Callable[[str], list[int]],
                        context_length: int = 248, *, late_by_one: bool) -> tuple[int, int]:
    """(start, length) of sentence k of `caption` in its tokenised sequence [BOS, BPE..., EOT, pad...].

    With n_pre = |bpe(prefix)|, prefix = '. '.join(sentences[:k]) + ('. ' if k else ''), and n = |bpe(sentence k)|
    (`tokenizer_fn`: BPE ids without special tokens):
      start = n_pre + 2 if late_by_one (released: the prefix's token count includes its BOS *and* EOS)
      start = n_pre + 1 otherwise (BOS only: the sentence's first token);  end = start + n.
    Truncation, as released (C = context_length, position C - 1 is a full caption's EOT):
      start >= C -> end = C - 1, start = max(1, end - n);  else end = min(start + n, C - 1);
      still empty (start = C - 1) -> tokens 1 .. min(1 + n, C).
    """
    sentences = caption_sentences(caption)
    prefix = ". ".join(sentences[:sentence_index]) + (". " if sentence_index else "")
    n_prefix = len(tokenizer_fn(prefix))
    n_sentence = len(tokenizer_fn(sentences[sentence_index]))
    if n_sentence == 0:
        raise ValueError(f"sentence {sentence_index} of the caption has no tokens")
    start = n_prefix + (2 if late_by_one else 1)
    last = context_length - 1
    if start >= context_length:
        end = last
        start = max(1, end - n_sentence)
    else:
        end = min(start + n_sentence, last)
    if end <= start:
        start, end = 1, min(1 + n_sentence, context_length)
    return start, end - start


# ---- encoders with last-layer hidden states -----------------------------------------------------------

def goal_normalize(x: torch.Tensor) -> torch.Tensor:
    """GOAL's n(x) = (x + 1e-8) / ||x + 1e-8||."""
    return F.normalize(x + EPS, dim=-1)


def _check_supported(model) -> None:
    visual = model.visual
    if (getattr(visual, "attn_pool", None) is not None or visual.pool_type != "tok" or visual.final_ln_after_pool
            or visual.proj is None or not isinstance(visual.patch_dropout, torch.nn.Identity)):
        raise NotImplementedError("GOAL needs a plain CLS-pooled open_clip ViT (no attentional pool, patch "
                                  "dropout or pool-then-LN)")
    if getattr(model, "text_pool_type", "argmax") != "argmax":
        raise NotImplementedError("GOAL needs open_clip's EOT (argmax) text pooling")


def image_head(model, tokens: torch.Tensor) -> torch.Tensor:
    """n(proj_v(LN_post(x))) of pre-LN vision tokens [..., width]."""
    return goal_normalize(model.visual.ln_post(tokens) @ model.visual.proj)


def text_head(model, tokens: torch.Tensor) -> torch.Tensor:
    """n(proj_t(LN_final(x))) of pre-LN text tokens [..., width]."""
    return goal_normalize(model.ln_final(tokens) @ model.text_projection)


def encode_image_hidden(model, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n(global features) [N, E], last-layer tokens before ln_post [N, P+1, width]) in one forward."""
    visual = model.visual
    x = visual.conv1(images)
    x = x.reshape(x.shape[0], x.shape[1], -1).permute(0, 2, 1)
    cls = visual.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
    x = torch.cat([cls, x], dim=1) + visual.positional_embedding.to(x.dtype)
    hidden = visual.transformer(visual.ln_pre(x))
    return image_head(model, hidden[:, 0]), hidden


def encode_text_hidden(model, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n(global features) [N, E], last-layer tokens before ln_final [N, T, width]) in one forward.

    `tokens` may be cut to any length that keeps every EOT: the causal mask makes position i depend on
    tokens <= i only, so the kept positions equal those of the full-context forward.
    """
    length = tokens.shape[1]
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens).to(cast_dtype) + model.positional_embedding[:length].to(cast_dtype)
    hidden = model.transformer(x, attn_mask=model.attn_mask[:length, :length])
    eot = hidden[torch.arange(hidden.shape[0], device=hidden.device), tokens.argmax(dim=-1)]
    return text_head(model, eot), hidden


@dataclass
class HiddenEncoded:
    """One forward of both towers: global features and last-layer hidden states."""

    image_features: torch.Tensor  # [N, E], n(.)
    text_features: torch.Tensor   # [N, E], n(.)
    image_hidden: torch.Tensor    # [N, P+1, width_v], before ln_post
    text_hidden: torch.Tensor     # [N, T', width_t], before ln_final


def encode_with_hidden(model, images: torch.Tensor, tokens: torch.Tensor, *, double_forward: bool,
                       autocast: Autocast = contextlib.nullcontext) -> HiddenEncoded:
    """Global features and hidden states of both towers, as the released step computes them
    (goal_loss_finetuning.py:250-256): the globals from a forward under `autocast` (the release's full
    `model(...)`, inside Fabric's bf16-mixed context), the hidden states from a second forward that calls the
    towers directly (`vision_model(...)`, `text_model(...)`), outside that context, so in fp32. Both graphs
    are back-propagated, as there. Where `autocast` is off the two forwards give the same values, and the
    second runs only with `double_forward` (cost only)."""
    with autocast():
        mixed = torch.is_autocast_enabled(images.device.type)
        image_features, image_hidden = encode_image_hidden(model, images)
        text_features, text_hidden = encode_text_hidden(model, tokens)
    if mixed or double_forward:
        _, image_hidden = encode_image_hidden(model, images)
        _, text_hidden = encode_text_hidden(model, tokens)
    return HiddenEncoded(image_features, text_features, image_hidden, text_hidden)


def pool_patches(model, image_hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """u = n(proj_v(LN_post(mean of the masked tokens))), [B, E]; the mean is taken in fp32."""
    weights = mask.to(torch.float32)
    mean = (as_float32(image_hidden) * weights[..., None]).sum(dim=1) / weights.sum(dim=1, keepdim=True)
    return image_head(model, mean)


def span_mask(spans: torch.Tensor, length: int) -> torch.Tensor:
    """[B, length] bool, True on positions start .. start + len - 1 of each (start, len) row of `spans`."""
    positions = torch.arange(length, device=spans.device)[None, :]
    return (positions >= spans[:, :1]) & (positions < spans[:, :1] + spans[:, 1:])


def pool_span(model, text_hidden: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """w = n(proj_t(LN_final(mean of the span's tokens))), [B, E]; the mean is taken in fp32."""
    weights = span_mask(spans, text_hidden.shape[1]).to(torch.float32)
    mean = (as_float32(text_hidden) * weights[..., None]).sum(dim=1) / weights.sum(dim=1, keepdim=True)
    return text_head(model, mean)


# ---- the objective ------------------------------------------------------------------------------------

@dataclass
class GoalBatch:
    """One GOAL micro-batch: originals, their max-similarity segment, and where the segment lies in both."""

    images: torch.Tensor          # [B, 3, S, S] original images
    tokens: torch.Tensor          # [B, T] full captions
    segment_images: torch.Tensor  # [B, 3, S, S] segment crops, same preprocessing
    segment_tokens: torch.Tensor  # [B, T] the matched sentence
    patch_mask: torch.Tensor      # [B, P+1] bool, True at the bbox's tokens (see `patch_mask()`; 0 = CLS)
    text_spans: torch.Tensor      # [B, 2] long, (start, length) of the sentence in `tokens`

    def to(self, device) -> GoalBatch:
        return GoalBatch(*(getattr(self, f.name).to(device) for f in fields(self)))


def _text_length(batch: GoalBatch) -> int:
    """Positions the text forward must keep: every caption/sentence up to its EOT and every span."""
    longest = text_length(torch.cat([batch.tokens, batch.segment_tokens]))
    return max(longest, int((batch.text_spans[:, 0] + batch.text_spans[:, 1]).max()))


def _check_batch(batch: GoalBatch, num_image_tokens: int) -> None:
    size = batch.images.shape[0]
    if batch.patch_mask.shape != (size, num_image_tokens):
        raise ValueError(f"patch_mask is {tuple(batch.patch_mask.shape)}, expected ({size}, {num_image_tokens})")
    if not bool(batch.patch_mask.any(dim=1).all()):
        raise ValueError("every sample needs at least one selected image token")
    start, length = batch.text_spans[:, 0], batch.text_spans[:, 1]
    if bool((start < 0).any() or (length < 1).any() or (start + length > batch.tokens.shape[1]).any()):
        raise ValueError("text spans must be non-empty and inside the caption's context")


def _alignment_mse(pooled: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """mean_b (pooled_b . target_b - 1)^2: no negatives, no temperature, gradients to both sides."""
    return ((as_float32(pooled) * as_float32(target)).sum(dim=-1) - 1).pow(2).mean()


def goal_loss_terms(model, batch: GoalBatch, objective: dict, settings: GoalSettings,
                    autocast: Autocast = contextlib.nullcontext) -> dict[str, torch.Tensor]:
    """GOAL's named terms for one micro-batch; `total` is what is back-propagated.

    Keys: `org` (the trained global term: L_HN if gamma > 0 else InfoNCE), the `contrastive_terms` entries it
    comes from (`hn` and/or `infonce`; with gamma > 0 `infonce` is a no-grad diagnostic), `seg`, `patch`,
    `text`, and `total` = org + seg_weight * seg + patch_weight * patch + text_weight * text.
    The global features come from a forward under `autocast`; the hidden states, their pooling and the
    LN + projection of the pooled tokens run outside it, in fp32, as released (`encode_with_hidden`); the
    losses are computed in fp32.
    """
    if objective.get("lambda_tok", 0) > 0 or g_source(objective) != "live":
        raise ValueError("GOAL swaps only its global term: lambda_tok must be 0 and g_source 'live'")
    _check_supported(model)
    grid = model.visual.grid_size
    _check_batch(batch, grid[0] * grid[1] + 1)
    size = batch.images.shape[0]
    tokens = torch.cat([batch.tokens, batch.segment_tokens])[:, :_text_length(batch)]
    encoded = encode_with_hidden(model, torch.cat([batch.images, batch.segment_images]), tokens,
                                 double_forward=settings.double_forward, autocast=autocast)
    # released: post_layernorm / visual_projection and final_layer_norm / text_projection of the pooled tokens
    # are called outside Fabric's autocast (:292-300, :339-348), so in fp32
    patch_pooled = pool_patches(model, encoded.image_hidden[:size], batch.patch_mask)
    text_pooled = pool_span(model, encoded.text_hidden[:size], batch.text_spans)
    image_features, text_features = as_float32(encoded.image_features), as_float32(encoded.text_features)
    scale = model.logit_scale.exp()  # unclamped, as released
    terms = contrastive_terms(image_features[:size], text_features[:size], scale, objective)
    terms["org"] = terms[trained_term(objective)]
    terms["seg"] = global_infonce_loss(image_features[size:], text_features[size:], scale)
    terms["patch"] = _alignment_mse(patch_pooled, image_features[size:])
    terms["text"] = _alignment_mse(text_pooled, text_features[size:])
    terms["total"] = (terms["org"] + settings.seg_weight * terms["seg"] + settings.patch_weight * terms["patch"]
                      + settings.text_weight * terms["text"])
    return terms
