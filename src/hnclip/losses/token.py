"""FILIP token-level late-interaction loss L_tok (paper §2.3, Eq. 3; Yao et al. 2021).

For image i with patch tokens v_ik and caption j with non-padding tokens t_jr (both L2-normalized):

    sim_i2t[i, j] = mean_k max_r cos(v_ik, t_jr)     (each patch finds its best word)
    sim_t2i[i, j] = mean_r max_k cos(v_ik, t_jr)     (each word finds its best patch)

    L_tok = ( CE(s * sim_i2t, y) + CE(s * sim_t2i^T, y) ) / 2,   y_i = i.

The full B x B x P x T similarity tensor is large (B=128, P=256, T=248 is ~1e9 entries), so the
public entry points build it one chunk of captions at a time, inside one autograd function per chunk
(`_BestMatches`) that keeps for backward only the two max reductions' argmax indices ([B, C, P] and
[B, C, T]) besides the token features: a chunk's B x C x P x T cosines exist only while its forward runs,
and its gradient (non-zero only at the two argmaxes) is scattered into one dense tensor for the two
matrix products of backward. Peak memory is therefore O(B * chunk * P * T), with no recomputation and
none of the full-size intermediates generic autograd keeps or builds for a masked copy and two amax
reductions (benchmarks/token_term_profile.py measures both). Where a row's maximum is tied (continuous
features practically never are), the gradient goes to one of the tied entries, as `torch.max` does.

Several independent batches (the contrastive groups of one compute-batch forward) are scored in one call
by giving every input a leading group dimension (`late_interaction_similarities`,
`grouped_token_alignment_losses`): block-diagonal, each group's captions against its own images only, with
the same per-element arithmetic, so each group's scores and gradients are bitwise those of its own call on
the CPU (tests/test_token_merge.py).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _symmetric_cross_entropy(logits_i2t: torch.Tensor, logits_t2i: torch.Tensor) -> torch.Tensor:
    targets = torch.arange(logits_i2t.shape[0], device=logits_i2t.device)
    return (F.cross_entropy(logits_i2t, targets) + F.cross_entropy(logits_t2i, targets)) / 2


def _at_least_float32(x: torch.Tensor) -> torch.Tensor:
    # Softmax over bf16/fp16 logits loses the small differences between hard negatives.
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _normalize_tokens(image_tokens, text_tokens, text_padding_mask):
    """L2-normalize tokens; padded text positions become exact zeros.

    Zeroing before normalization (instead of only masking the scores) keeps any value at a padded
    position, even inf/NaN, out of both the scores and every gradient.
    """
    if text_padding_mask.shape != text_tokens.shape[:-1]:
        raise ValueError(f"text_padding_mask {tuple(text_padding_mask.shape)} does not match "
                         f"text_tokens {tuple(text_tokens.shape[:-1])}")
    if not bool((~text_padding_mask).any(dim=-1).all()):
        raise ValueError("every caption needs at least one non-padding token")
    text_tokens = text_tokens.masked_fill(text_padding_mask.unsqueeze(-1), 0.0)
    return F.normalize(image_tokens, dim=-1), F.normalize(text_tokens, dim=-1)


# einsum equations of the cosines and of their backward: one batch of images against one chunk of captions
# ([B, P, D], [C, T, D]), or G such blocks at once ([G, B, P, D], [G, C, T, D]: `grouped_token_alignment_losses`)
_EQUATIONS = {3: ("ipd,jtd->ijpt", "ijpt,jtd->ipd", "ijpt,ipd->jtd"),
              4: ("gipd,gjtd->gijpt", "gijpt,gjtd->gipd", "gijpt,gipd->gjtd")}


class _BestMatches(torch.autograd.Function):
    """Each patch's best word and each word's best patch of B images against one chunk of C captions.

    forward(images [B, P, D], texts [C, T, D], padding [C, T]) -> best word per patch [B, C, P] (padded
    words excluded) and best patch per word [B, C, T] (-inf at padded words); with a leading group
    dimension G on all three, G independent blocks at once ([G, B, C, P], [G, B, C, T]). Saves the argmax
    indices, not the [B, C, P, T] cosines; backward scatters the two incoming gradients to the argmaxes
    and runs the two matrix products of the cosines' einsum backward.
    """

    @staticmethod
    def forward(ctx, images, texts, padding):
        cosines = torch.einsum(_EQUATIONS[images.dim()][0], images, texts)        # [(G,) B, C, P, T]
        cosines.masked_fill_(padding.unsqueeze(-2).unsqueeze(-4), float("-inf"))  # in place: no copy
        best_word, word_index = cosines.max(dim=-1)
        best_patch, patch_index = cosines.max(dim=-2)
        ctx.save_for_backward(images, texts, word_index, patch_index)
        return best_word, best_patch

    @staticmethod
    def backward(ctx, grad_best_word, grad_best_patch):
        images, texts, word_index, patch_index = ctx.saved_tensors
        _, to_images, to_texts = _EQUATIONS[images.dim()]
        dtype = torch.promote_types(images.dtype, texts.dtype)  # the forward's scores may be autocast's
        grad = torch.zeros(*word_index.shape, patch_index.shape[-1], dtype=dtype, device=images.device)
        grad.scatter_add_(-1, word_index.unsqueeze(-1), grad_best_word.to(dtype).unsqueeze(-1))
        grad.scatter_add_(-2, patch_index.unsqueeze(-2), grad_best_patch.to(dtype).unsqueeze(-2))
        grad_images = grad_texts = None
        if ctx.needs_input_grad[0]:
            grad_images = torch.einsum(to_images, grad, texts.to(dtype)).to(images.dtype)
        if ctx.needs_input_grad[1]:
            grad_texts = torch.einsum(to_texts, grad, images.to(dtype)).to(texts.dtype)
        return grad_images, grad_texts, None


def _chunk_scores(image_tokens: torch.Tensor, text_tokens: torch.Tensor,
                  text_padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Late-interaction scores of all images against one chunk of C captions.

    image_tokens [B, P, D] and text_tokens [C, T, D] normalized; returns two [B, C] blocks (with a
    leading group dimension G on the inputs, two [G, B, C]).
    """
    best_word_per_patch, best_patch_per_word = _BestMatches.apply(image_tokens, text_tokens, text_padding_mask)
    sim_i2t = best_word_per_patch.mean(dim=-1)
    best_patch_per_word = best_patch_per_word.masked_fill(text_padding_mask.unsqueeze(-3), 0.0)  # [(G,) B, C, T]
    words_per_caption = (~text_padding_mask).sum(dim=-1).to(best_patch_per_word.dtype).unsqueeze(-2)
    sim_t2i = best_patch_per_word.sum(dim=-1) / words_per_caption
    return sim_i2t, sim_t2i


def late_interaction_similarities(image_tokens: torch.Tensor, text_tokens: torch.Tensor,
                                  text_padding_mask: torch.Tensor, chunk_size: int | None = None
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """FILIP scores (sim_i2t, sim_t2i), both [B_img, B_txt] indexed [image, caption].

    Tokens are projected but not yet normalized; text_padding_mask [B_txt, T] is True at padding.
    chunk_size is the number of captions per chunk (None: all at once). With a leading group dimension
    G on all three inputs, G independent blocks' scores, [G, B_img, B_txt] each.
    """
    images, texts = _normalize_tokens(image_tokens, text_tokens, text_padding_mask)
    captions = texts.shape[-3]
    chunk_size = captions if chunk_size is None else int(chunk_size)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    blocks_i2t, blocks_t2i = [], []
    for start in range(0, captions, chunk_size):
        rows = slice(start, start + chunk_size)
        sim_i2t, sim_t2i = _chunk_scores(images, texts[..., rows, :, :], text_padding_mask[..., rows, :])
        blocks_i2t.append(sim_i2t)
        blocks_t2i.append(sim_t2i)
    return torch.cat(blocks_i2t, dim=-1), torch.cat(blocks_t2i, dim=-1)


def token_alignment_loss(image_tokens: torch.Tensor, text_tokens: torch.Tensor,
                         text_padding_mask: torch.Tensor, logit_scale: torch.Tensor | float,
                         chunk_size: int | None = None) -> torch.Tensor:
    """L_tok for a batch of B matched pairs; logit_scale is the exponentiated scale s."""
    if image_tokens.shape[0] != text_tokens.shape[0]:
        raise ValueError("image and text batches must be paired (same B)")
    sim_i2t, sim_t2i = late_interaction_similarities(image_tokens, text_tokens, text_padding_mask,
                                                     chunk_size)
    return token_loss_of_similarities(sim_i2t, sim_t2i, logit_scale)


def token_loss_of_similarities(sim_i2t: torch.Tensor, sim_t2i: torch.Tensor,
                               logit_scale: torch.Tensor | float) -> torch.Tensor:
    """L_tok of one batch from its FILIP scores (`late_interaction_similarities`, both [B, B])."""
    sim_i2t, sim_t2i = _at_least_float32(sim_i2t), _at_least_float32(sim_t2i)
    return _symmetric_cross_entropy(logit_scale * sim_i2t, logit_scale * sim_t2i.t())


def grouped_token_alignment_losses(image_tokens: torch.Tensor, text_tokens: torch.Tensor,
                                   text_padding_mask: torch.Tensor, logit_scale: torch.Tensor | float,
                                   chunk_size: int | None = None) -> torch.Tensor:
    """L_tok of G independent batches of B matched pairs in one call: [G] losses, the g-th that of
    `token_alignment_loss` on image_tokens[g], text_tokens[g], text_padding_mask[g] alone.

    Inputs [G, B, P, D], [G, B, T, D], [G, B, T]. Block-diagonal: a group's captions are scored only
    against its own images, and its softmax runs over its own B captions (the negatives of a group's
    L_tok are its own pairs, as when each group is computed alone). chunk_size: captions per chunk
    within each group, so one chunk's cosines are G times those of `token_alignment_loss`'s.
    """
    if image_tokens.dim() != 4 or image_tokens.shape[:2] != text_tokens.shape[:2]:
        raise ValueError(f"grouped token features must be [G, B, P, D] and [G, B, T, D] with the same G and B, "
                         f"got {tuple(image_tokens.shape)} and {tuple(text_tokens.shape)}")
    sim_i2t, sim_t2i = late_interaction_similarities(image_tokens, text_tokens, text_padding_mask,
                                                     chunk_size)
    # The B x B cross-entropies group by group: the same reduction order as `token_alignment_loss`'s, so
    # each group's loss is bitwise that of its own call on the CPU (a batched mean over [G * B] rows sums in
    # another order: within 1e-7 relative, not equal); 2G small kernels beside the merged token scores.
    return torch.stack([token_loss_of_similarities(i2t, t2i, logit_scale) for i2t, t2i in zip(sim_i2t, sim_t2i)])


def _token_alignment_loss_naive(image_tokens, text_tokens, text_padding_mask, logit_scale):
    """Reference for tests: one einsum over the full B x B x P x T tensor, masking by weights."""
    images = F.normalize(image_tokens, dim=-1)
    texts = F.normalize(text_tokens, dim=-1)
    valid = (~text_padding_mask).to(images.dtype)                            # [B, T]
    cosines = torch.einsum("ipd,jtd->ijpt", images, texts)                   # [B, B, P, T]
    masked = torch.where(text_padding_mask[None, :, None, :], float("-inf"), cosines)
    sim_i2t = masked.max(dim=-1).values.mean(dim=-1)
    sim_t2i = (cosines.max(dim=-2).values * valid).sum(dim=-1) / valid.sum(dim=-1)
    return _symmetric_cross_entropy(logit_scale * sim_i2t, logit_scale * sim_t2i.t())


class TokenAlignmentLoss(nn.Module):
    """L_tok in open_clip's ClipLoss style; the trainer adds it to L_HN with weight lambda."""

    def __init__(self, chunk_size: int | None = None):
        super().__init__()
        self.chunk_size = chunk_size

    def forward(self, image_tokens, text_tokens, text_padding_mask, logit_scale,
                output_dict: bool = False):
        loss = token_alignment_loss(image_tokens, text_tokens, text_padding_mask, logit_scale,
                                    self.chunk_size)
        return {"token_loss": loss} if output_dict else loss
