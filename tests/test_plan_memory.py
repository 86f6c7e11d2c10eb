"""The memory model of `hnclip plan` (hnclip.plan.accelerator_memory): its per-block activation bytes against what
autograd really saves at Long-CLIP-L's widths and token counts, and its verdicts on the paper profile."""
from __future__ import annotations

import contextlib
from pathlib import Path

import open_clip
import pytest
import torch

from hnclip.config.constants import CONTEXT_LENGTH
from hnclip.config.params import load_params
from hnclip.config.registry import Registry
from hnclip.models.adapters import apply_adapters
from hnclip.models.towers import encode_text
from hnclip.plan.accelerator_memory import GB, FrameworkMemory, Tower, memory_model

ROOT = Path(__file__).resolve().parents[1]


IMAGE = Tower(257, 1024, 1, 4.0, 224 * 224)       # ViT-L/14 at 224 px
TEXT = Tower(CONTEXT_LENGTH, 768, 1, 4.0)          # Long-CLIP's 248-token text tower


def long_clip_l(layers: int) -> open_clip.model.CLIP:
    vision = dict(image_size=224, layers=layers, width=1024, patch_size=14, head_width=64)
    text = dict(context_length=CONTEXT_LENGTH, vocab_size=49408, width=768, heads=12, layers=layers)
    return open_clip.model.CLIP(768, vision, text, quick_gelu=True)


def saved_bytes(model: torch.nn.Module, tower: str, pairs: int, bf16: bool) -> int:
    """Bytes of the distinct non-parameter storages autograd saves for one forward of a tower."""
    kept: list[torch.Tensor] = []   # held, so that no freed storage's address is reused by another
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept.append(tensor)
        return tensor

    generator = torch.Generator().manual_seed(0)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), autocast:
        if tower == "image":
            model.visual(torch.randn(pairs, 3, 224, 224, generator=generator))
        else:
            tokens = torch.randint(1, 49000, (pairs, CONTEXT_LENGTH), generator=generator)
            tokens[:, -1] = 49407
            encode_text(model, tokens)
    storages = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes() for tensor in kept}
    return sum(size for pointer, size in storages.items() if pointer not in parameters)


def measured_block_bytes(kind: str, tower: str, bf16: bool) -> float:
    """Bytes a block saves per pair: the second difference over blocks (1, 2) and pairs (2, 4), which
    removes what a forward saves once (autocast's weight copies) and what sits outside the blocks."""
    models = {}
    for layers in (1, 2):
        model = long_clip_l(layers)
        models[layers] = model if kind == "full" else apply_adapters(model, kind).base_model.model
    saved = {(layers, pairs): saved_bytes(models[layers], tower, pairs, bf16) for layers in (1, 2) for pairs in (2, 4)}
    return (saved[2, 4] - saved[1, 4] - saved[2, 2] + saved[1, 2]) / 2


@pytest.mark.parametrize(("kind", "bf16", "tolerance"), [("full", False, 0.02), ("full", True, 0.12),
                                                         ("dora", False, 0.02), ("dora", True, 0.08),
                                                         ("lora", True, 0.08)])
@pytest.mark.parametrize("tower", ["image", "text"])
def test_block_bytes_match_what_autograd_saves_at_long_clip_l_widths(kind, bf16, tolerance, tower):
    torch.manual_seed(0)
    shape = IMAGE if tower == "image" else TEXT
    modelled = shape.block_values(2 if bf16 else 4, adapter=None if kind == "full" else kind)
    measured = measured_block_bytes(kind, tower, bf16)
    assert measured == pytest.approx(modelled, rel=tolerance)


def test_a_block_holds_80_bytes_per_token_width_value_in_fp32_and_44_in_bf16():
    value = Tower(1, 1, 1, 4.0)
    assert value.block_values(4) == 80
    assert value.block_values(2) == 44
    assert value.block_values(4, adapter="dora") == 80 + 2 * 9 * 4
    assert value.block_values(2, adapter="dora") == 44 + 9 * 4 + 9 * 2
    assert value.block_values(2, adapter="lora") == 44 + 2 * 2 and value.block_values(4, adapter="lora") == 80


def test_checkpointing_keeps_one_fp32_residual_per_token_and_block():
    tower = Tower(10, 8, 3, 4.0, pixels=0)
    outside = 4 * 10 * 8 * 4
    assert tower.pass_bytes(2, checkpointing=True) == outside + 3 * 10 * 8 * 4
    assert tower.pass_bytes(2) == outside + 3 * 10 * 8 * 44


def entry(per_pair_gb: float, fixed_gb: float = 8.0, compute_batch: int = 128) -> FrameworkMemory:
    return FrameworkMemory("x", "hn_clip", 1, "bf16", fixed_gb * GB, per_pair_gb * GB, per_pair_gb * GB / 10,
                           16, compute_batch, 36)


def test_the_ladder_halves_the_compute_batch_down_to_the_micro_batch_then_checkpoints():
    assert entry(0.4).ladder() == [(128, False), (64, False), (32, False), (16, False), (16, True)]
    assert entry(0.4, compute_batch=16).ladder() == [(16, False), (16, True)]


def test_first_fit_is_the_first_plan_under_ninety_percent_of_the_card():
    memory = entry(0.5)                                  # peaks: 72, 40, 24, 16 GB; + ckpt 8.8
    assert memory.peak_gb(128) == pytest.approx(72.0)
    assert memory.first_fit(80) == (128, False)          # 72 <= 72
    assert memory.first_fit(64) == (64, False)           # 40 <= 57.6
    assert memory.first_fit(24) == (16, False)           # 16 <= 21.6
    assert memory.first_fit(12) == (16, True)
    assert entry(0.5, fixed_gb=20).first_fit(12) is None


@pytest.fixture(scope="module")
def paper_memory() -> dict[str, FrameworkMemory]:
    reg = Registry(load_params(ROOT / "params.yaml"), profile="paper")
    return {memory.name: memory for memory in memory_model(reg)}


def test_paper_profile_kinds_runs_and_precisions(paper_memory):
    assert {name: (m.runs, m.precision) for name, m in paper_memory.items()} == {
        "finelip": (6, "fp32"), "goal": (13, "bf16"), "structxlip": (7, "bf16"), "full": (28, "bf16"),
        "lora": (6, "bf16"), "dora": (6, "bf16"), "frozen_g": (3, "bf16")}


def test_paper_defaults_against_the_cards(paper_memory):
    full, goal, dora = paper_memory["full"], paper_memory["goal"], paper_memory["dora"]
    # Long-CLIP-L: 427.7 M parameters; fp32 weights, gradients, AdamW's moments and bf16 weight copies
    assert full.fixed_bytes == pytest.approx(18 * 427_747_841)
    assert full.compute_batch == 128
    assert full.first_fit(80) == (128, False)
    assert full.first_fit(64) == (64, False)           # the 910B falls back once
    assert full.first_fit(48) == (64, False)
    assert full.first_fit(24) == (32, False)
    assert goal.first_fit(48) == (16, False)
    assert goal.first_fit(40) == (16, True)            # GOAL's second fp32 pass needs checkpointing below 48 GB
    assert dora.first_fit(24) == (16, False)
    assert paper_memory["finelip"].first_fit(24) == (16, False)
