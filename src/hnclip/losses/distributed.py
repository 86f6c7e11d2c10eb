"""Contrastive losses over the global batch of a multi-process (torchrun) run, open_clip ClipLoss style.
One concept at two layers: this is the loss side of multi-process data parallelism (features gathered,
every rank computing the global loss); the training side (ranks, the process group, gradient averaging)
is `hnclip.training.distributed`.

Each rank holds a contiguous slice of the global micro-batch. Features are all-gathered in rank
order, so the gathered batch is the single-process batch in the same order, and every rank
evaluates the same global loss: InfoNCE, L_HN with G built from the gathered captions, and the
token term over all gathered image/caption tokens.

Gradients. The gather's backward all-reduces (sums) the gradient w.r.t. the gathered tensor and
returns each rank its own slice. Every rank computes the same loss L, so rank r's features receive
sum over ranks of dL/df_r = world_size * dL/df_r, and averaging the parameter gradients over ranks
(as DDP does) gives exactly dL/dtheta of the single-process computation. (open_clip's
`gather_with_grad=False` variant, which only puts the local tensor back into the gathered list,
would give dL/dtheta / world_size after averaging.) A parameter used outside the features, the
logit scale, gets the full dL/ds on every rank, which averaging leaves unchanged.

Without an initialised process group (or with one process) every function here is the identity
on its inputs, so single-process results are bit-identical to calling the plain losses.
Requirement: every rank passes the same local batch size (all_gather needs equal shapes).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hnclip.losses.contrastive import infonce_loss
from hnclip.losses.token import token_alignment_loss


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class _AllGatherWithGrad(torch.autograd.Function):
    """Concatenate every rank's tensor along dim 0; backward sums the gradients over ranks."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        ctx.local_size = tensor.shape[0]
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, tensor, group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        # all_reduce rather than reduce_scatter: gloo (CPU tests) has no reduce_scatter, and
        # feature gradients are small.
        grad = grad_output.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad.narrow(0, ctx.rank * ctx.local_size, ctx.local_size), None


def all_gather_with_grad(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """All ranks' tensors concatenated in rank order (dim 0); the identity in a single process."""
    if not is_distributed():
        return tensor
    return _AllGatherWithGrad.apply(tensor, group)


def gather_features(image_features: torch.Tensor, text_features: torch.Tensor,
                    g_text_features: torch.Tensor | None = None, group=None):
    """(image, text, G) features of the global batch; G features (those of the frozen G source) are
    detached already and only gathered, so G is built from all captions of the batch."""
    gathered_margin = None if g_text_features is None else all_gather_with_grad(g_text_features, group)
    return all_gather_with_grad(image_features, group), all_gather_with_grad(text_features, group), gathered_margin


def gather_token_features(image_tokens: torch.Tensor, text_tokens: torch.Tensor,
                          text_padding_mask: torch.Tensor, group=None):
    """Token features and padding mask of the global batch.

    Captions are trimmed per rank to the local longest caption, so text tokens are padded (zeros,
    mask True) to the longest over all ranks first; padded positions are masked out of the token
    loss, so the padding changes nothing but the tensor shape.
    """
    if not is_distributed():
        return image_tokens, text_tokens, text_padding_mask
    length = torch.tensor([text_tokens.shape[1]], device=text_tokens.device)
    dist.all_reduce(length, op=dist.ReduceOp.MAX, group=group)
    extra = int(length) - text_tokens.shape[1]
    if extra:
        text_tokens = F.pad(text_tokens, (0, 0, 0, extra))
        text_padding_mask = F.pad(text_padding_mask, (0, extra), value=True)
    mask = all_gather_with_grad(text_padding_mask.to(torch.uint8), group).bool()  # gloo gathers no bool
    return all_gather_with_grad(image_tokens, group), all_gather_with_grad(text_tokens, group), mask


# ---- each loss on the global batch, with correct local gradients (see the module docstring) -----
def global_infonce_loss(image_features, text_features, logit_scale, group=None) -> torch.Tensor:
    image_features, text_features, _ = gather_features(image_features, text_features, group=group)
    return infonce_loss(image_features, text_features, logit_scale)


def global_token_alignment_loss(image_tokens, text_tokens, text_padding_mask, logit_scale,
                                chunk_size: int | None = None, group=None) -> torch.Tensor:
    image_tokens, text_tokens, text_padding_mask = gather_token_features(
        image_tokens, text_tokens, text_padding_mask, group)
    return token_alignment_loss(image_tokens, text_tokens, text_padding_mask, logit_scale, chunk_size=chunk_size)
