"""Which pairs each optimizer step trains on: a pure function of (seed, epoch), so a resumed run
sees the same micro-batches as an uninterrupted one."""
from __future__ import annotations

import torch


def epoch_micro_batches(indices: list[int], micro_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """Shuffled micro-batches of one epoch; the incomplete tail is dropped so every softmax has
    the same number of candidates."""
    generator = torch.Generator().manual_seed(seed * 1000 + epoch)
    order = [indices[i] for i in torch.randperm(len(indices), generator=generator).tolist()]
    return [order[i:i + micro_batch] for i in range(0, len(order) - micro_batch + 1, micro_batch)]


def accumulation_groups(micro_batches: list, grad_accum: int) -> list[list]:
    return [micro_batches[i:i + grad_accum] for i in range(0, len(micro_batches), grad_accum)]
