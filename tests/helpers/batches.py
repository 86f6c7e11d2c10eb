"""Random accumulation groups and a fresh tiny model, shared by the tests of the paths that compute
the contrastive terms (compute_batch, exact batch, the margin controls, the gradient probe)."""
from __future__ import annotations

from typing import Callable

import torch

from hnclip.config.constants import PAD_ID
from hnclip.models.factory import create

SOT, EOT = 49406, 49407   # open_clip's start and end tokens


def accumulation_group(micro: int, accum: int, seed: int = 1,
                       length_range: Callable[[int], tuple[int, int]] = lambda row: (4, 12)
                       ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`accum` micro-batches of `micro` random 64 px images and random captions; caption `row` has a
    length drawn from `length_range(row)` (low inclusive, high exclusive), start and end tokens included."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(micro * accum, 3, 64, 64, generator=generator)
    tokens = torch.full((micro * accum, 248), PAD_ID, dtype=torch.long)
    for row in range(micro * accum):
        length = int(torch.randint(*length_range(row), (1,), generator=generator))
        tokens[row, 0], tokens[row, length - 1] = SOT, EOT
        tokens[row, 1:length - 1] = torch.randint(1, SOT, (length - 2,), generator=generator)
    return list(zip(images.split(micro), tokens.split(micro)))


def tiny_model(state: dict) -> torch.nn.Module:
    """A fresh hnclip-tiny in train mode with the weights `state` (e.g. the `tiny_state` fixture's)."""
    model = create("hnclip-tiny").model
    model.load_state_dict(state)
    return model.train()
