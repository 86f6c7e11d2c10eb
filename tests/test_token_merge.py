"""The token term of a compute-batch forward in one call: every group's L_tok, its records and every
gradient bitwise those of one call per group on the CPU (block-diagonal: a group's negatives stay its own)."""
from __future__ import annotations

import contextlib

import pytest
import torch
from helpers.batches import accumulation_group, tiny_model

import hnclip.training.compute_batch as compute_batch
from hnclip.losses.objective import group_terms
from hnclip.losses.token import grouped_token_alignment_losses, token_alignment_loss

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny shapes, one thread

G, B, P, T, D = 3, 4, 5, 9, 8
OBJECTIVE = {"gamma": 0.5, "lambda_tok": 1.0, "g_source": "live"}


def _leaves(*tensors):
    return [tensor.clone().requires_grad_(True) for tensor in tensors]


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_grouped_losses_are_each_groups_own_call(chunk_size):
    generator = torch.Generator().manual_seed(3)
    images, texts = torch.randn(G, B, P, D, generator=generator), torch.randn(G, B, T, D, generator=generator)
    lengths = torch.randint(1, T + 1, (G, B), generator=generator)
    mask = torch.arange(T) >= lengths[..., None]                                       # [G, B, T]
    scale = torch.tensor(20.0)
    per_group = _leaves(images, texts, scale)
    alone = torch.stack([token_alignment_loss(per_group[0][g], per_group[1][g], mask[g], per_group[2], chunk_size)
                         for g in range(G)])
    (alone * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    merged = _leaves(images, texts, scale)
    together = grouped_token_alignment_losses(merged[0], merged[1], mask, merged[2], chunk_size)
    (together * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert torch.equal(together.detach(), alone.detach())
    for got, want in zip(merged, per_group):
        assert torch.equal(got.grad, want.grad)
    # block-diagonal: another group's tokens change nothing of group 0's loss
    other = images.clone()
    other[1:] = torch.randn(G - 1, B, P, D, generator=generator)
    assert torch.equal(grouped_token_alignment_losses(other, texts, mask, scale, chunk_size)[0], together[0].detach())


def test_compute_batch_scores_all_groups_at_once_with_unchanged_records_and_gradients(tiny_state, monkeypatch):
    micro, accum = 4, 4
    batches = accumulation_group(micro, accum, 2, lambda row: (3, 6 + 5 * (row // micro)))  # per-group lengths
    calls = []
    real = compute_batch.grouped_token_similarities
    monkeypatch.setattr(compute_batch, "grouped_token_similarities", lambda *a: calls.append(a[1]) or real(*a))

    def backward(terms):
        model = tiny_model(tiny_state)
        records = compute_batch.compute_batch_backward(model, batches, OBJECTIVE, None, contextlib.nullcontext,
                                                       lambda record: None, micro * accum, micro, terms=terms)
        return records, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    merged_records, merged = backward(group_terms)
    assert calls == [accum]  # one call for the forward's four groups
    each_records, each = backward(lambda *args, **kwargs: group_terms(*args, **kwargs))  # one call per group
    assert calls == [accum]
    assert merged_records == each_records and all(r["tok"] > 0 for r in merged_records)
    assert merged.keys() == each.keys() and all(torch.equal(merged[name], each[name]) for name in each)
