"""Multi-process data parallelism for `train` under torchrun (one process per accelerator). One concept
at two layers: this is the training side (ranks, the process group, gradient averaging); the loss side
(features gathered, every rank computing the global loss) is `hnclip.losses.distributed`.

    torchrun --nproc_per_node 8 -m hnclip train --run <run_id>

Rank r takes a contiguous slice of every global micro-batch, so the gathered batch is the
single-process batch (`hnclip.losses.distributed` computes the losses on it). Parameter gradients
are averaged over ranks once per optimizer step, after the accumulation group, by an explicit
bucketed all-reduce rather than a `DistributedDataParallel` wrapper: DDP's reducer expects each
backward to follow a forward through the wrapper and each parameter's hook to fire once per
synchronised backward, which the GradCache two-stage backward (logit-scale gradient first,
encoder gradients in the re-forwards), the token-term passes and the gradient probe's
`autograd.grad` do not satisfy. With gradient accumulation DDP would only all-reduce once per
step anyway (`no_sync` on all but the last micro-batch); what is lost is the overlap of that one
all-reduce with the last backward.

Single process (no WORLD_SIZE > 1 in the environment): every helper is a no-op.
"""
from __future__ import annotations

import datetime
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.distributed as dist

from hnclip.runtime.device import parse_device, resolve_device

BACKENDS = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}
# Rank 0 evaluates alone at epoch ends while the other ranks wait in a collective.
COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)
BUCKET_ELEMENTS = 1 << 26  # 256 MiB of fp32 gradients per all-reduce: bounds the extra memory


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def local_slice(self, batch_indices: list[int]) -> list[int]:
        """This rank's contiguous share of one global micro-batch."""
        size = len(batch_indices) // self.world_size
        return batch_indices[self.rank * size:(self.rank + 1) * size]

    def check_micro_batch(self, micro_batch: int) -> None:
        if micro_batch % self.world_size:
            raise ValueError(f"micro_batch {micro_batch} is not divisible by the {self.world_size} processes; "
                             f"every rank must hold the same share of each global micro-batch")

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast_from_main(self, module: torch.nn.Module) -> None:
        """Make every rank's weights rank 0's (they are built identically; this makes sure)."""
        if self.enabled:
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Average .grad over ranks; every rank must have gradients for the same parameters."""
        if not self.enabled:
            return
        grads = [p.grad for p in parameters if p.grad is not None]
        _require_same_count(len(grads), grads[0].device if grads else torch.device("cpu"))
        average_tensors(grads, self.world_size)

    def device(self, requested: str) -> torch.device:
        """The accelerator of this process: index = LOCAL_RANK under torchrun."""
        kind = resolve_device(requested).type
        if not self.enabled or kind not in ("cuda", "npu"):
            return resolve_device(requested)
        return resolve_device(f"{kind}:{self.local_rank}")


def average_tensors(tensors: list[torch.Tensor], world_size: int) -> None:
    """In-place mean over ranks, in buckets of same dtype and device (one all-reduce each)."""
    for bucket in _buckets(tensors):
        flat = torch.cat([t.reshape(-1) for t in bucket])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= world_size
        for tensor, part in zip(bucket, flat.split([t.numel() for t in bucket])):
            tensor.copy_(part.view_as(tensor))


def _buckets(tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    bucket, size = [], 0
    for tensor in tensors:
        if bucket and (size + tensor.numel() > BUCKET_ELEMENTS or tensor.dtype != bucket[0].dtype
                       or tensor.device != bucket[0].device):
            yield bucket
            bucket, size = [], 0
        bucket.append(tensor)
        size += tensor.numel()
    if bucket:
        yield bucket


def _require_same_count(count: int, device: torch.device) -> None:
    counts = torch.tensor([count, -count], device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    if int(counts[0]) != count or int(-counts[1]) != count:
        raise RuntimeError(f"ranks disagree on which parameters have gradients ({count} here, "
                           f"{int(-counts[1])}..{int(counts[0])} across ranks)")


def _environment() -> Distributed:
    return Distributed(rank=int(os.environ.get("RANK", 0)), world_size=int(os.environ.get("WORLD_SIZE", 1)),
                       local_rank=int(os.environ.get("LOCAL_RANK", 0)))


@contextmanager
def distributed_session(requested_device: str) -> Iterator[Distributed]:
    """Join the process group torchrun describes (WORLD_SIZE > 1), or use one already initialised;
    a group created here is destroyed on exit. Yields this process's rank information."""
    if dist.is_available() and dist.is_initialized():
        yield Distributed(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
        return
    context = _environment()
    if not context.enabled:
        yield context
        return
    kind, _ = parse_device(resolve_device(requested_device))
    if kind in ("cuda", "npu"):
        getattr(torch, kind).set_device(context.local_rank)  # collectives use the current device
    dist.init_process_group(BACKENDS.get(kind, "gloo"), timeout=COLLECTIVE_TIMEOUT)
    try:
        yield context
    finally:
        dist.destroy_process_group()
