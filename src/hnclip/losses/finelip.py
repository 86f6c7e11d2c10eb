"""FineLIP's fine-grained training objective (Asokan et al., CVPR'25) for the plug-and-play study.

Re-implemented from the formula-level spec of the released code (shared/research/baselines.md §3,
FL = ffa-ti-ma/FineLIP@9389127). With V the projected image tokens (CLS first) and X the projected
text tokens of a batch, n() row-wise L2 normalisation and Agg a learned token aggregator:

    image set   I_i = n([V_i,cls ; Agg_img(V_i,patches)])            [N_s + 1, C]
    caption set T_j = n([Agg_txt(X_j[0:e_j]) ; X_j[e_j]])            [N_s + 1, C], e_j = EOT index
    s(i, j)     = mean_t max_v M + mean_v max_t M,   M = LeakyReLU_0.1(T_j I_i^T)
    L_fine      = sum_{i != j} [m + S_ij - S_ii]_+ + [m + S_ij - S_jj]_+     (or max-violation)

FineLIP mode trains L_fine alone (the released `loss_1 = 0.0`); the paper's "+L_HN" variant (D.2)
therefore *adds* L_HN on the plain CLIP global embeddings, which are also what evaluation uses (D.3):
the aggregation module exists at training time only.

Choices where the release is silent or quirky (protocol settings, see `DEFAULT_SETTINGS`):
- EOT index: the released code takes L_j = number of non-zero token ids and uses X_j[L_j - 1] as
  EOT. open_clip pads with id 0, but id 0 is also the BPE token "!" (rare: only a "!" that BPE does
  not merge). We take the EOT as open_clip's pooling rule does (argmax id), so the appended token
  is always the one behind the global text feature; both rules agree on every caption without id 0.
- Padding: the release slices each caption to its length and aggregates it alone; here the batch
  is aggregated at once with padded positions zeroed and masked out of the softmax (the same
  result up to float rounding; tested).
- N_s = floor(num_patches * aggr_ratio * sparse_ratio): the release's num_patches defaults to 196
  even for ViT-L/14 (N_s = 39). `num_patches=None` uses the backbone's own patch count instead
  (64 -> 12 for the tiny model, 256 -> 51 for ViT-L/14@224).
- In-batch positives are the diagonal only (the release also zeroes pairs sharing an image id;
  our training sets have one caption per image).
- The fine term is computed in fp32 outside autocast, on the gathered batch in multi-process runs
  (the release gathers image sets and score columns, giving the same global S).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from hnclip.config.objective_keys import g_source
from hnclip.losses.distributed import all_gather_with_grad
from hnclip.losses.objective import Autocast, as_float32, contrastive_terms
from hnclip.models.towers import encode_batch

DEFAULT_SETTINGS = {
    "margin": 0.2,           # hinge margin m (FL arguments.py --margin)
    "max_violation": False,  # FL default: sum over all violating negatives
    "num_patches": 196,      # FL default (ViT-B/16 grid, also used for L/14); None = the backbone's own count
    "aggr_ratio": 0.4,       # FL --aggr_ratio
    "sparse_ratio": 0.5,     # FL --sparse_ratio (selection itself is disabled in FL; only N_s uses it)
}
HIDDEN_RATIO = 0.2           # aggregator MLP width as a fraction of C (FL TokenAggregation dim_ratio)
LEAKY_SLOPE = 0.1            # negative slope of the SCAN-style LeakyReLU on token cosines
SIMILARITY_CHUNK = 64        # captions per block of the [B, chunk, N_t, N_v] score tensor


def finelip_settings(settings: dict | None = None) -> dict:
    """The complete FineLIP settings: `DEFAULT_SETTINGS` overridden by `settings`."""
    settings = dict(settings or {})
    unknown = set(settings) - set(DEFAULT_SETTINGS)
    if unknown:
        raise ValueError(f"unknown FineLIP settings {sorted(unknown)}; known: {sorted(DEFAULT_SETTINGS)}")
    return {**DEFAULT_SETTINGS, **settings}


def n_selected(num_patches: int, aggr_ratio: float = 0.4, sparse_ratio: float = 0.5) -> int:
    """Number of aggregated tokens N_s, floored in the release's float order."""
    count = int(num_patches * aggr_ratio * sparse_ratio)
    if count < 1:
        raise ValueError(f"N_s = floor({num_patches} * {aggr_ratio} * {sparse_ratio}) must be >= 1")
    return count


def fine_warmup_factor(epoch_index: int, batch_index: int, n_batches: int) -> float:
    """FL's ramp of L_fine: batch_index / n_batches during epoch 0, then 1.

    batch_index is the 0-based micro-batch (dataloader iteration) within the epoch and n_batches
    the micro-batches per epoch, as in FL train.py; the first micro-batch is thus weighted 0.
    """
    return batch_index / n_batches if epoch_index == 0 else 1.0


class TokenAggregator(nn.Module):
    """FineLIP's Agg: N tokens -> N_s learned convex combinations of them.

    W = Linear(GELU(Linear(LN(Z)))) in R^{N x N_s}; A = softmax over N of gamma * W^T; out = A Z.
    """

    def __init__(self, dim: int, n_out: int, hidden_ratio: float = HIDDEN_RATIO):
        super().__init__()
        hidden = int(dim * hidden_ratio)
        self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, n_out))
        self.gamma = nn.Parameter(torch.ones(1, 1, 1))

    def forward(self, tokens: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, N, C], padding_mask [B, N] True at padding -> [B, N_s, C]."""
        if padding_mask is not None:
            if not bool((~padding_mask).any(dim=1).all()):
                raise ValueError("every sequence needs at least one non-padding token")
            # Zeroed before the MLP, so no value at a padded position (even inf/NaN) reaches any
            # output or gradient; -inf logits give padding exactly zero weight.
            tokens = tokens.masked_fill(padding_mask.unsqueeze(-1), 0.0)
        logits = self.mlp(tokens).transpose(1, 2) * self.gamma                      # [B, N_s, N]
        if padding_mask is not None:
            logits = logits.masked_fill(padding_mask.unsqueeze(1), float("-inf"))
        return torch.bmm(logits.softmax(dim=-1), tokens)


class FineLIPModule(nn.Module):
    """FineLIP's cross-modal module: separate image and text aggregators building the token sets."""

    def __init__(self, embed_dim: int, num_patches: int = 196, aggr_ratio: float = 0.4,
                 sparse_ratio: float = 0.5):
        super().__init__()
        self.n_selected = n_selected(num_patches, aggr_ratio, sparse_ratio)
        self.image_aggregator = TokenAggregator(embed_dim, self.n_selected)
        self.text_aggregator = TokenAggregator(embed_dim, self.n_selected)

    def image_sets(self, cls_features: torch.Tensor, patch_tokens: torch.Tensor) -> torch.Tensor:
        """n([V_cls; Agg_img(V_patches)]): cls [B, C], patches [B, P, C] -> [B, N_s + 1, C]."""
        tokens = torch.cat([cls_features.unsqueeze(1), self.image_aggregator(patch_tokens)], dim=1)
        return F.normalize(tokens, dim=-1)

    def text_sets(self, text_tokens: torch.Tensor, eot_index: torch.Tensor) -> torch.Tensor:
        """n([Agg_txt(X[0:e]); X[e]]): tokens [B, T, C], EOT positions e [B] -> [B, N_s + 1, C]."""
        positions = torch.arange(text_tokens.shape[1], device=text_tokens.device)
        after_words = positions[None, :] >= eot_index[:, None]        # EOT and padding: not aggregated
        aggregated = self.text_aggregator(text_tokens, after_words)
        eot = text_tokens[torch.arange(text_tokens.shape[0], device=text_tokens.device), eot_index]
        return F.normalize(torch.cat([aggregated, eot.unsqueeze(1)], dim=1), dim=-1)


def build_finelip_module(model: nn.Module, settings: dict | None = None) -> FineLIPModule:
    """The module for an open_clip CLIP: C = its joint embedding width, N_s from `settings`."""
    settings = finelip_settings(settings)
    grid = model.visual.grid_size
    num_patches = settings["num_patches"] if settings["num_patches"] is not None else grid[0] * grid[1]
    return FineLIPModule(model.text_projection.shape[1], num_patches, settings["aggr_ratio"],
                         settings["sparse_ratio"])


def check_cls_pooling(visual: nn.Module) -> None:
    """Require open_clip's CLS pooling, under which the pooled image feature is FineLIP's V_cls.

    With `pool_type='tok'`, no attention pooling and LN_post before pooling, open_clip 3.3's
    VisionTransformer returns pooled = LN_post(x)[:, 0] @ proj (= V_cls) and tokens = LN_post(x)[:, 1:]
    (the CLS token excluded; `encode_image` projects them into V_patches). The normalised pooled
    feature is then n(V_cls), which the set normalisation leaves unchanged.
    """
    if visual.pool_type != "tok" or visual.attn_pool is not None or visual.final_ln_after_pool:
        raise ValueError("FineLIP needs a CLS-pooled ViT (pool_type='tok', no attn_pool, LN_post before "
                         f"pooling); got pool_type={visual.pool_type!r}, attn_pool={visual.attn_pool is not None}, "
                         f"final_ln_after_pool={visual.final_ln_after_pool}")


def _block_scores(image_sets: torch.Tensor, text_sets: torch.Tensor,
                  text_mask: torch.Tensor | None) -> torch.Tensor:
    """s(i, j) of all images against one block of captions: [B_i, B_block]."""
    cosines = F.leaky_relu(torch.einsum("jtc,ivc->ijtv", text_sets, image_sets), LEAKY_SLOPE)  # [Bi, Bj, Nt, Nv]
    if text_mask is None:
        return cosines.amax(dim=-1).mean(dim=-1) + cosines.amax(dim=-2).mean(dim=-1)
    padding = text_mask[None, :, :, None]
    best_patch = cosines.amax(dim=-1).masked_fill(padding[..., 0], 0.0)                  # [Bi, Bj, Nt]
    words = (~text_mask).sum(dim=-1).to(best_patch.dtype)
    best_word = cosines.masked_fill(padding, float("-inf")).amax(dim=-2)                 # [Bi, Bj, Nv]
    return best_patch.sum(dim=-1) / words + best_word.mean(dim=-1)


def finelip_similarity(image_sets: torch.Tensor, text_sets: torch.Tensor, text_mask: torch.Tensor | None = None,
                       chunk_size: int | None = SIMILARITY_CHUNK) -> torch.Tensor:
    """FineLIP scores S [B_i, B_t] of normalised sets image_sets [B_i, N_i, C], text_sets [B_t, N_t, C].

    text_mask [B_t, N_t] is True at padded text rows (None: every row is real, FineLIP's case).
    Captions are processed chunk_size at a time (None: all at once) to bound the score tensor.
    """
    if text_mask is not None and not bool((~text_mask).any(dim=1).all()):
        raise ValueError("every text set needs at least one non-padding token")
    chunk_size = text_sets.shape[0] if chunk_size is None else int(chunk_size)
    blocks = []
    for start in range(0, text_sets.shape[0], chunk_size):
        rows = slice(start, start + chunk_size)
        blocks.append(_block_scores(image_sets, text_sets[rows], None if text_mask is None else text_mask[rows]))
    return torch.cat(blocks, dim=1)


def finelip_hinge(scores: torch.Tensor, margin: float = 0.2, max_violation: bool = False) -> torch.Tensor:
    """VSE hinge on S [B, B] (image rows, caption columns; pairs on the diagonal).

    c_s[i, j] = [m + S_ij - S_ii]_+ (captions ranked for image i), c_im[i, j] = [m + S_ij - S_jj]_+
    (images ranked for caption j), both zero on the diagonal; summed over all entries, or only each
    row's (c_s) / column's (c_im) largest when max_violation.
    """
    positives = scores.diagonal()
    diagonal = torch.eye(scores.shape[0], dtype=torch.bool, device=scores.device)
    cost_s = (margin + scores - positives[:, None]).clamp(min=0).masked_fill(diagonal, 0.0)
    cost_im = (margin + scores - positives[None, :]).clamp(min=0).masked_fill(diagonal, 0.0)
    if max_violation:
        return cost_s.amax(dim=1).sum() + cost_im.amax(dim=0).sum()
    return cost_s.sum() + cost_im.sum()


def eot_positions(tokens: torch.Tensor) -> torch.Tensor:
    """Position of each caption's EOT: its largest token id, open_clip's pooling rule."""
    return tokens.argmax(dim=-1)


def finelip_loss_terms(model, module: FineLIPModule, images: torch.Tensor, tokens: torch.Tensor, objective: dict,
                       settings: dict | None = None, warmup_factor: float = 1.0,
                       autocast: Autocast = contextlib.nullcontext) -> dict[str, torch.Tensor]:
    """FineLIP's named terms for one micro-batch; `total` is what is back-propagated.

    fine: warmup_factor * L_fine. infonce: global InfoNCE, always a no-grad diagnostic. hn (gamma > 0):
    L_HN on the global CLIP embeddings, added to the total (paper D.2); FineLIP alone has no global term.
    """
    settings = finelip_settings(settings)
    if objective.get("lambda_tok", 0) > 0:
        raise ValueError("FineLIP mode has no FILIP token term; set lambda_tok to 0")
    if objective["gamma"] > 0 and g_source(objective) != "live":
        raise ValueError("FineLIP mode supports only L_HN with G from the live text encoder (g_source: live)")
    check_cls_pooling(model.visual)
    with autocast():
        encoded = encode_batch(model, images, tokens, with_tokens=True)
    image_sets = module.image_sets(as_float32(encoded.image_features), as_float32(encoded.image_tokens))
    # Positions within the trimmed text (encode_text pools the EOT the same way).
    eot_index = eot_positions(tokens[:, : encoded.text_tokens.shape[1]])
    text_sets = module.text_sets(as_float32(encoded.text_tokens), eot_index)
    scores = finelip_similarity(all_gather_with_grad(image_sets), all_gather_with_grad(text_sets))
    fine = warmup_factor * finelip_hinge(scores, settings["margin"], settings["max_violation"])

    scale = model.logit_scale.exp()
    trains_global = objective["gamma"] > 0
    with contextlib.nullcontext() if trains_global else torch.no_grad():
        terms = contrastive_terms(encoded.image_features, encoded.text_features, scale, objective)
    terms["fine"] = fine
    terms["total"] = fine + terms["hn"] if trains_global else fine
    return terms
