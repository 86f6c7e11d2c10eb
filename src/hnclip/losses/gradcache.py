"""Exact large-batch contrastive loss with micro-batch activation memory (GradCache; Gao et al. 2021).

The paper's "effective batch 128" is micro-batch 16 with 8x gradient accumulation, so each softmax
sees only 16 captions. Contrastive losses do not decompose over micro-batches, so to get the true
128-way loss (and its gradient) without holding 128 samples' activations we:

  1. encode every micro-batch under no_grad (cheap: no activations kept), recording RNG states;
  2. evaluate the full-batch loss on the cached embeddings as detached leaves and backprop it,
     which yields d loss / d embedding (and d loss / d logit scale, through the caller's graph);
  3. re-encode each micro-batch with grad, under the RNG state of step 1 so dropout draws the same
     masks, and backprop the cached embedding gradient through it.

Parameter .grad then accumulates exactly what a single full-batch backward would produce.
Requirements: the encoder must be deterministic given the RNG state, and must not mix samples
across a batch (true for CLIP's LayerNorm towers, not for BatchNorm). Under DDP, wrap all but the
last re-forward in `model.no_sync()` so gradients are all-reduced once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch

Encode = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
MicroBatch = tuple[torch.Tensor, torch.Tensor]  # (images, texts)


def split_micro_batches(images: torch.Tensor, texts: torch.Tensor,
                        micro_batch_size: int) -> list[MicroBatch]:
    """Split a paired batch into consecutive (images, texts) micro-batches."""
    if images.shape[0] != texts.shape[0]:
        raise ValueError("images and texts must have the same batch size")
    return list(zip(images.split(micro_batch_size), texts.split(micro_batch_size)))


def _cuda_devices(tensors: Sequence[torch.Tensor]) -> list[int]:
    return sorted({t.device.index for t in tensors if t.is_cuda})


@dataclass
class _RngState:
    """CPU and CUDA generator states, so a re-forward can replay the same dropout masks."""
    cpu: torch.Tensor
    cuda: dict[int, torch.Tensor]

    @classmethod
    def capture(cls, devices: Sequence[int]) -> "_RngState":
        return cls(torch.get_rng_state(), {d: torch.cuda.get_rng_state(d) for d in devices})

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        for device, state in self.cuda.items():
            torch.cuda.set_rng_state(state, device)


def _total_loss(output) -> torch.Tensor:
    # Losses called with output_dict=True return named terms that the trainer sums.
    return sum(output.values()) if isinstance(output, Mapping) else output


def _encode_without_grad(encode: Encode, micro_batches: Sequence[MicroBatch]):
    """Step 1: all embeddings, plus the RNG state each micro-batch's forward started from."""
    image_parts, text_parts, rng_states = [], [], []
    for images, texts in micro_batches:
        rng_states.append(_RngState.capture(_cuda_devices((images, texts))))
        with torch.no_grad():
            image_features, text_features = encode(images, texts)
        image_parts.append(image_features)
        text_parts.append(text_features)
    return torch.cat(image_parts), torch.cat(text_parts), rng_states


def _embedding_gradients(loss_fn, image_features, text_features, logit_scale, scale_loss):
    """Step 2: full-batch loss on detached leaves; backward fills their .grad (and the scale's)."""
    image_leaf = image_features.detach().requires_grad_(True)
    text_leaf = text_features.detach().requires_grad_(True)
    loss = _total_loss(loss_fn(image_leaf, text_leaf, logit_scale))
    (loss if scale_loss is None else scale_loss(loss)).backward()
    return loss.detach(), image_leaf.grad, text_leaf.grad


def _backward_through_encoder(encode: Encode, micro_batches: Sequence[MicroBatch],
                              rng_states: Sequence[_RngState], image_grads, text_grads) -> None:
    """Step 3: re-encode each micro-batch with grad and push its cached embedding gradient."""
    for (images, texts), rng_state, image_grad, text_grad in zip(
            micro_batches, rng_states, image_grads, text_grads):
        # fork_rng leaves the global RNG as step 1 left it, as if the batch was encoded once.
        with torch.random.fork_rng(devices=list(rng_state.cuda)):
            rng_state.restore()
            image_features, text_features = encode(images, texts)
        candidates = ((image_features, image_grad), (text_features, text_grad))
        pairs = [(out, grad) for out, grad in candidates if out.requires_grad and grad is not None]
        if pairs:
            outputs, grads = zip(*pairs)
            torch.autograd.backward(outputs, grads)


def gradcache_backward(encode: Encode, micro_batches: Sequence[MicroBatch],
                       logit_scale: torch.Tensor | float, loss_fn: Callable,
                       scale_loss: Callable[[torch.Tensor], torch.Tensor] | None = None
                       ) -> torch.Tensor:
    """Backprop the full-batch contrastive loss over all micro-batches; returns the loss (detached).

    encode(images, texts) -> (image_features, text_features), L2-normalized.
    loss_fn follows our ClipLoss contract: loss_fn(image_features, text_features, logit_scale),
        e.g. `HNClipLoss(0.5)` or `ContrastiveLoss()`; the margin matrix of HNClipLoss is then built
        from all captions of the full batch.
    logit_scale is the exponentiated scale (e.g. `model.logit_scale.exp()`); if it requires grad,
        its gradient reaches the underlying parameter in step 2.
    scale_loss, e.g. `GradScaler.scale`, is applied to the loss before backward (fp16 training).
    Gradients accumulate into parameter .grad like `loss.backward()`; zero them beforehand.
    """
    micro_batches = list(micro_batches)
    if not micro_batches:
        raise ValueError("need at least one micro-batch")
    image_features, text_features, rng_states = _encode_without_grad(encode, micro_batches)
    loss, image_grad, text_grad = _embedding_gradients(loss_fn, image_features, text_features,
                                                       logit_scale, scale_loss)
    sizes = [images.shape[0] for images, _ in micro_batches]
    image_grads = [None] * len(sizes) if image_grad is None else image_grad.split(sizes)
    text_grads = [None] * len(sizes) if text_grad is None else text_grad.split(sizes)
    _backward_through_encoder(encode, micro_batches, rng_states, image_grads, text_grads)
    return loss


class GradCache:
    """Holds the encoder, loss and micro-batch size; `step(images, texts, logit_scale)` runs
    `gradcache_backward` on the batch split into micro-batches and returns the loss."""

    def __init__(self, encode: Encode, loss_fn: Callable, micro_batch_size: int,
                 scale_loss: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        self.encode = encode
        self.loss_fn = loss_fn
        self.micro_batch_size = int(micro_batch_size)
        self.scale_loss = scale_loss

    def step(self, images: torch.Tensor, texts: torch.Tensor,
             logit_scale: torch.Tensor | float) -> torch.Tensor:
        micro_batches = split_micro_batches(images, texts, self.micro_batch_size)
        return gradcache_backward(self.encode, micro_batches, logit_scale, self.loss_fn,
                                  self.scale_loss)
