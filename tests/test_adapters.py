"""LoRA / DoRA on a tiny open_clip CLIP: identity at init, every adapter trains, base frozen,
adapter-only checkpoints, and merging into a plain CLIP without changing outputs."""
from __future__ import annotations

import copy

import pytest
import torch
from open_clip.model import CLIP
from open_clip.transformer import CustomResidualAttentionBlock, ResidualAttentionBlock

from hnclip.losses import infonce_loss
from hnclip.models.adapters import (
    SplitQKVAttention,
    adapter_parameters,
    adapter_state_dict,
    apply_adapters,
    load_adapter_state_dict,
    merge_adapters,
    split_qkv,
    to_custom_blocks,
)
from hnclip.models.towers import encode_batch

KINDS = ["lora", "dora"]
BATCH = 4
TARGETED = ("q_proj", "k_proj", "v_proj", "out_proj", "c_fc", "c_proj")


def make_tiny_clip(seed: int = 0) -> CLIP:
    torch.manual_seed(seed)
    model = CLIP(
        embed_dim=64,
        vision_cfg={"image_size": 32, "patch_size": 8, "width": 64, "layers": 2, "head_width": 32},
        text_cfg={"context_length": 248, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
        quick_gelu=True,
    )
    return model.eval()


def make_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(BATCH, 3, 32, 32, generator=generator)
    tokens = torch.zeros(BATCH, 248, dtype=torch.long)
    for row, length in enumerate([12, 40, 120, 248]):  # EOT (49407, the largest id) closes each caption
        tokens[row, :length - 1] = torch.randint(1, 49406, (length - 1,), generator=generator)
        tokens[row, length - 1] = 49407
    return images, tokens


def features(model, images, tokens):
    with torch.no_grad():
        return model.encode_image(images), model.encode_text(tokens)


def assert_same_features(model_a, model_b, batch, atol):
    for a, b in zip(features(model_a, *batch), features(model_b, *batch)):
        torch.testing.assert_close(a, b, atol=atol, rtol=0)


def train_steps(peft_model, batch, steps: int, lr: float = 1e-3):
    optimizer = torch.optim.AdamW(adapter_parameters(peft_model).values(), lr=lr)
    peft_model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        encoded = encode_batch(peft_model, *batch, with_tokens=False)
        loss = infonce_loss(encoded.image_features, encoded.text_features, peft_model.logit_scale.exp())
        loss.backward()
        optimizer.step()
    peft_model.eval()
    return optimizer


@pytest.fixture(scope="module")
def base():
    return make_tiny_clip()


@pytest.fixture(scope="module")
def batch():
    return make_batch()


# ---------------------------------------------------------------------------------------------
# Block conversion
# ---------------------------------------------------------------------------------------------

def test_custom_blocks_load_the_same_weights(base, batch):
    custom = to_custom_blocks(base)
    assert all(isinstance(b, CustomResidualAttentionBlock) for b in custom.transformer.resblocks)
    assert all(isinstance(b, CustomResidualAttentionBlock) for b in custom.visual.transformer.resblocks)
    assert custom.state_dict().keys() == base.state_dict().keys()
    assert_same_features(base, custom, batch, atol=1e-6)
    assert isinstance(base.transformer.resblocks[0], ResidualAttentionBlock)  # input untouched


def test_split_qkv_keeps_outputs(base, batch):
    split = split_qkv(to_custom_blocks(base))
    assert all(isinstance(b.attn, SplitQKVAttention) for b in split.transformer.resblocks)
    assert_same_features(base, split, batch, atol=1e-6)
    w = base.transformer.resblocks[1].attn.in_proj_weight
    assert torch.equal(split.transformer.resblocks[1].attn.v_proj.weight, w[128:])


def test_split_qkv_requires_custom_blocks(base):
    with pytest.raises(TypeError, match="to_custom_blocks"):
        split_qkv(copy.deepcopy(base))


# ---------------------------------------------------------------------------------------------
# Adapters
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_identity_at_init(base, batch, kind):
    peft_model = apply_adapters(base, kind, r=4)
    assert_same_features(base, peft_model, batch, atol=1e-6)
    assert isinstance(base.transformer.resblocks[0].attn, torch.nn.MultiheadAttention)  # base untouched


@pytest.mark.parametrize("kind", KINDS)
def test_every_attention_and_mlp_linear_of_both_towers_is_adapted(base, kind):
    peft_model = apply_adapters(base, kind, r=4)
    adapted = {name.rsplit(".lora_A", 1)[0] for name in adapter_parameters(peft_model) if ".lora_A." in name}
    expected = {f"base_model.model.{tower}resblocks.{layer}.{part}.{name}"
                for tower in ("transformer.", "visual.transformer.") for layer in (0, 1)
                for part, names in (("attn", TARGETED[:4]), ("mlp", TARGETED[4:])) for name in names}
    assert adapted == expected
    assert all("lora_" in name for name in adapter_parameters(peft_model))
    if kind == "dora":
        assert sum("lora_magnitude_vector" in name for name in adapter_parameters(peft_model)) == len(expected)


@pytest.mark.parametrize("kind", KINDS)
def test_one_step_trains_every_adapter_and_nothing_else(base, batch, kind):
    peft_model = apply_adapters(base, kind, r=4)
    frozen = {n: p.detach().clone() for n, p in peft_model.named_parameters() if not p.requires_grad}
    assert frozen and all("lora_" not in name for name in frozen)
    assert not peft_model.logit_scale.requires_grad

    train_steps(peft_model, batch, steps=1)  # lora_B starts at zero, so lora_A's first gradient is zero
    peft_model.train()
    encoded = encode_batch(peft_model, *batch, with_tokens=False)
    infonce_loss(encoded.image_features, encoded.text_features, peft_model.logit_scale.exp()).backward()

    for name, param in adapter_parameters(peft_model).items():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    for name, param in peft_model.named_parameters():
        if name in frozen:
            assert param.grad is None, name
            assert torch.equal(param.detach(), frozen[name]), name


@pytest.mark.parametrize("kind", KINDS)
def test_adapter_state_dict_holds_only_adapters_and_round_trips(base, batch, kind):
    trained = apply_adapters(base, kind, r=4)
    train_steps(trained, batch, steps=2)
    state = adapter_state_dict(trained)
    assert state and all("lora_" in key for key in state)
    assert sum(v.numel() for v in state.values()) == sum(p.numel() for p in adapter_parameters(trained).values())

    restored = apply_adapters(base, kind, r=4)
    load_adapter_state_dict(restored, state)
    assert_same_features(trained, restored, batch, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_merge_keeps_outputs_and_gives_a_plain_clip(base, batch, kind):
    peft_model = apply_adapters(base, kind, r=4)
    train_steps(peft_model, batch, steps=3)
    adapted_features = features(peft_model, *batch)

    merged = merge_adapters(peft_model)
    assert type(merged) is CLIP
    assert all(isinstance(b, ResidualAttentionBlock) for b in merged.transformer.resblocks)
    assert merged.state_dict().keys() == base.state_dict().keys()
    for ours, theirs in zip(features(merged, *batch), adapted_features):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
    # training did move the model, and merging left the adapted model as it was
    assert (features(merged, *batch)[1] - features(base, *batch)[1]).abs().max() > 1e-3
    for ours, theirs in zip(features(peft_model, *batch), adapted_features):
        assert torch.equal(ours, theirs)


def test_text_only_target_leaves_vision_unadapted(base):
    peft_model = apply_adapters(base, "lora", r=4, target="text")
    names = list(adapter_parameters(peft_model))
    assert names and not any(".visual." in name for name in names)


def test_unknown_kind_is_rejected(base):
    with pytest.raises(ValueError, match="ia3"):
        apply_adapters(base, "ia3")
