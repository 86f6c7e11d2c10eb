"""Long-CLIP checkpoint loading: a scaled-down checkpoint with the released key layout, loaded through
`load_longclip`, must reproduce an independent forward pass written with plain torch ops over the
raw state dict (applying PE*mask1 + PE_res*mask2 the way Long-CLIP's encode_text does)."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from torchvision.transforms import (
    CenterCrop,
    Compose,
    InterpolationMode,
    Normalize,
    Resize,
    ToTensor,
)

from hnclip import hashing
from hnclip.config.registry import Registry
from hnclip.data import verified_files
from hnclip.hashing import sha256_file
from hnclip.models.longclip import (
    LONGCLIP_L_SHA256,
    CheckpointMismatchError,
    ChecksumMismatchError,
    build_open_clip_from_openai_state_dict,
    convert_longclip_state_dict,
    load_longclip,
    stretch_openai_state_dict,
    stretch_positional_embedding,
)
from hnclip.provenance.audit import audit
from hnclip.rehearsal.miniature_models import longclip_layout_state_dict

WIDTH, LAYERS, IMAGE, PATCH, EMBED, VOCAB, CONTEXT = 64, 2, 32, 8, 64, 49408, 248
HEAD_WIDTH = 32  # 2 heads per tower, so head splitting is exercised (real Long-CLIP-L: 64)
HEADS = WIDTH // HEAD_WIDTH
EOT = 49407
TOL = 1e-5


# ---------------------------------------------------------------------------------------------
# A scaled-down checkpoint with exactly the released key layout (OpenAI CLIP names + PE_res)
# ---------------------------------------------------------------------------------------------

def make_longclip_state_dict(seed: int = 0, context: int = CONTEXT, with_res: bool = True) -> dict[str, torch.Tensor]:
    return longclip_layout_state_dict(width=WIDTH, layers=LAYERS, image=IMAGE, patch=PATCH, embed=EMBED, vocab=VOCAB,
                                      context=context, seed=seed, with_res=with_res)


# ---------------------------------------------------------------------------------------------
# Independent reference forward (plain torch over the raw state dict)
# ---------------------------------------------------------------------------------------------

def _layer_norm(x, sd, prefix):
    return F.layer_norm(x, (x.shape[-1],), sd[f"{prefix}.weight"], sd[f"{prefix}.bias"], eps=1e-5)


def _attention(x, sd, prefix, heads, additive_mask=None):
    batch, length, width = x.shape
    qkv = x @ sd[f"{prefix}.in_proj_weight"].T + sd[f"{prefix}.in_proj_bias"]
    q, k, v = (t.reshape(batch, length, heads, width // heads).transpose(1, 2) for t in qkv.split(width, dim=-1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(width // heads)
    if additive_mask is not None:
        scores = scores + additive_mask
    out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, length, width)
    return out @ sd[f"{prefix}.out_proj.weight"].T + sd[f"{prefix}.out_proj.bias"]


def _quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


def _residual_block(x, sd, prefix, heads, additive_mask=None):
    x = x + _attention(_layer_norm(x, sd, f"{prefix}.ln_1"), sd, f"{prefix}.attn", heads, additive_mask)
    hidden = _quick_gelu(_layer_norm(x, sd, f"{prefix}.ln_2") @ sd[f"{prefix}.mlp.c_fc.weight"].T
                         + sd[f"{prefix}.mlp.c_fc.bias"])
    return x + hidden @ sd[f"{prefix}.mlp.c_proj.weight"].T + sd[f"{prefix}.mlp.c_proj.bias"]


def reference_encode_text(sd, tokens, heads=HEADS):
    """Long-CLIP's model_longclip.CLIP.encode_text, over the unconverted state dict."""
    context = sd["positional_embedding"].shape[0]
    mask1 = torch.zeros(context, 1)
    mask1[:20] = 1
    mask2 = torch.zeros(context, 1)
    mask2[20:] = 1
    x = sd["token_embedding.weight"][tokens]
    x = x + sd["positional_embedding"] * mask1 + sd["positional_embedding_res"] * mask2
    causal = torch.full((context, context), float("-inf")).triu(1)
    for layer in range(LAYERS):
        x = _residual_block(x, sd, f"transformer.resblocks.{layer}", heads, causal)
    x = _layer_norm(x, sd, "ln_final")
    return x[torch.arange(x.shape[0]), tokens.argmax(dim=-1)] @ sd["text_projection"]


def reference_encode_image(sd, images, heads=HEADS):
    x = F.conv2d(images, sd["visual.conv1.weight"], stride=PATCH).flatten(2).transpose(1, 2)
    cls = sd["visual.class_embedding"].expand(x.shape[0], 1, -1)
    x = torch.cat([cls, x], dim=1) + sd["visual.positional_embedding"]
    x = _layer_norm(x, sd, "visual.ln_pre")
    for layer in range(LAYERS):
        x = _residual_block(x, sd, f"visual.transformer.resblocks.{layer}", heads)
    return _layer_norm(x[:, 0], sd, "visual.ln_post") @ sd["visual.proj"]


# ---------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def longclip_sd():
    return make_longclip_state_dict()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, longclip_sd):
    path = tmp_path_factory.mktemp("ckpt") / "longclip-tiny.pt"
    torch.save(longclip_sd, path)
    return path


@pytest.fixture(scope="module")
def loaded(checkpoint):
    return load_longclip(checkpoint, expected_sha256=sha256_file(checkpoint), head_width=HEAD_WIDTH)


CAPTIONS = [
    "a photo of a cat",
    "a red bicycle leaning against a weathered brick wall beside a blue door, under a striped awning, "
    "with potted geraniums on the windowsill and a small dog asleep on the step",
    "a very long dense caption " + "with many repeated details about the scene " * 40,  # > 248 tokens
]


# ---------------------------------------------------------------------------------------------
# Forward parity
# ---------------------------------------------------------------------------------------------

def test_text_features_match_longclip_reference(loaded, longclip_sd):
    tokens = loaded.tokenizer(CAPTIONS)
    assert tokens.shape == (3, CONTEXT)
    lengths = (tokens != 0).sum(dim=1)
    assert lengths[0] < 20 < lengths[1] and lengths[2] == CONTEXT  # rows from both PE tensors are used
    with torch.no_grad():
        ours = loaded.model.encode_text(tokens)
        reference = reference_encode_text(longclip_sd, tokens)
    assert ours.dtype == torch.float32
    assert reference.abs().max() > 0.1  # not a degenerate comparison
    torch.testing.assert_close(ours, reference, atol=TOL, rtol=TOL)


def test_merged_pe_is_effective_pe(longclip_sd):
    merged = convert_longclip_state_dict(longclip_sd)["positional_embedding"]
    assert merged.shape == (CONTEXT, WIDTH)
    assert torch.equal(merged[:20], longclip_sd["positional_embedding"][:20])
    assert torch.equal(merged[20:], longclip_sd["positional_embedding_res"][20:])
    assert "positional_embedding_res" not in convert_longclip_state_dict(longclip_sd)
    assert "positional_embedding_res" in longclip_sd  # input untouched


def test_image_features_match_reference(loaded, longclip_sd):
    images = torch.randn(3, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = loaded.model.encode_image(images)
        reference = reference_encode_image(longclip_sd, images)
    torch.testing.assert_close(ours, reference, atol=TOL, rtol=TOL)


def test_loaded_model_is_fp32_quickgelu_with_248_context(loaded):
    model = loaded.model
    assert model.context_length == CONTEXT and model.attn_mask.shape == (CONTEXT, CONTEXT)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not model.training
    assert type(model.transformer.resblocks[0].mlp.gelu).__name__ == "QuickGELU"
    assert model.transformer.resblocks[0].attn.num_heads == HEADS
    assert model.visual.transformer.resblocks[0].attn.num_heads == HEADS
    assert len(loaded.sha256) == 64


def test_preprocess_equals_longclip_transform(loaded):
    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 256, size=(45, 60, 3), dtype=np.uint8))
    longclip_transform = Compose([  # Long-CLIP model/longclip.py::_transform
        Resize(IMAGE, interpolation=InterpolationMode.BICUBIC), CenterCrop(IMAGE),
        lambda im: im.convert("RGB"), ToTensor(),
        Normalize((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    ])
    ours = loaded.preprocess(image)
    assert ours.shape == (3, IMAGE, IMAGE)
    assert torch.equal(ours, longclip_transform(image))


def test_tokenizer_truncates_keeping_eot_last(loaded):
    tokens = loaded.tokenizer(CAPTIONS[2])[0]
    encoded = loaded.tokenizer.encode(CAPTIONS[2])
    assert len(encoded) + 2 > CONTEXT
    assert tokens[-1].item() == EOT
    assert tokens[0].item() == loaded.tokenizer.sot_token_id
    assert tokens[1:-1].tolist() == encoded[:CONTEXT - 2]  # = longclip.tokenize(truncate=True)


# ---------------------------------------------------------------------------------------------
# Strictness
# ---------------------------------------------------------------------------------------------

def _converted(longclip_sd):
    return convert_longclip_state_dict(longclip_sd)


def test_missing_key_is_named(longclip_sd):
    sd = _converted(longclip_sd)
    del sd["visual.ln_post.bias"]
    with pytest.raises(CheckpointMismatchError, match=r"missing key: visual\.ln_post\.bias") as info:
        build_open_clip_from_openai_state_dict(sd, head_width=HEAD_WIDTH)
    assert info.value.missing == ["visual.ln_post.bias"]


def test_extra_key_is_named(longclip_sd):
    sd = _converted(longclip_sd)
    sd["transformer.resblocks.0.attn.bias_k"] = torch.zeros(1, 1, WIDTH)
    with pytest.raises(CheckpointMismatchError, match=r"unexpected key: transformer\.resblocks\.0\.attn\.bias_k"):
        build_open_clip_from_openai_state_dict(sd, head_width=HEAD_WIDTH)


def test_wrong_shape_is_named(longclip_sd):
    sd = _converted(longclip_sd)
    sd["transformer.resblocks.1.attn.out_proj.weight"] = torch.zeros(WIDTH, WIDTH - 1)
    with pytest.raises(CheckpointMismatchError,
                       match=r"shape mismatch: transformer\.resblocks\.1\.attn\.out_proj\.weight"):
        build_open_clip_from_openai_state_dict(sd, head_width=HEAD_WIDTH)


def test_several_problems_are_all_named(longclip_sd):
    sd = _converted(longclip_sd)
    del sd["logit_scale"]
    sd["extra.weight"] = torch.zeros(1)
    sd["visual.proj"] = torch.zeros(WIDTH, EMBED + 1)
    with pytest.raises(CheckpointMismatchError) as info:
        build_open_clip_from_openai_state_dict(sd, head_width=HEAD_WIDTH)
    message = str(info.value)
    assert "logit_scale" in message and "extra.weight" in message and "visual.proj" in message


def test_unconverted_longclip_state_dict_is_rejected(longclip_sd):
    with pytest.raises(CheckpointMismatchError, match=r"unexpected key: positional_embedding_res"):
        build_open_clip_from_openai_state_dict(longclip_sd, head_width=HEAD_WIDTH)


def test_file_without_pe_res_is_not_a_longclip_checkpoint(tmp_path):
    path = tmp_path / "openai.pt"
    torch.save(make_longclip_state_dict(with_res=False), path)
    with pytest.raises(CheckpointMismatchError, match=r"missing key: positional_embedding_res"):
        load_longclip(path, expected_sha256=None, head_width=HEAD_WIDTH)


def test_state_dict_wrapper_and_ddp_prefix_are_unwrapped(tmp_path, longclip_sd, loaded):
    path = tmp_path / "wrapped.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in longclip_sd.items()}}, path)
    model = load_longclip(path, expected_sha256=None, head_width=HEAD_WIDTH).model
    for key, value in loaded.model.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key


# ---------------------------------------------------------------------------------------------
# Hash pinning
# ---------------------------------------------------------------------------------------------

def test_hash_mismatch_raises(checkpoint):
    with pytest.raises(ChecksumMismatchError, match="verify_hash=False"):
        load_longclip(checkpoint, expected_sha256="0" * 64, head_width=HEAD_WIDTH)


CURRENT_COMMIT = "a29856989d49817508dbda0fb95c7f6ffc314331"  # BeichenZhang/LongCLIP-L, after the DDP fix
FIRST_UPLOAD_SHA256 = "60c077e512cd95ca9fe7b13285e4e2c99073f8d6df7113eb6d2979919db397b2"  # commit 92e2948


def _verified_as(checkpoint, directory, sha256: str):
    """A copy of `checkpoint` with the `.complete` marker `hnclip download` would leave had it hashed
    to `sha256` (loads trust the marker: a stand-in for the 1.7 GB files)."""
    path = directory / "longclip-L.pt"
    path.write_bytes(checkpoint.read_bytes())
    verified_files._write_marker(path, {"sha256": sha256}, "sha256", sha256, None)
    return path


def test_default_pin_is_the_current_longclip_l_release(checkpoint):
    assert LONGCLIP_L_SHA256 == "9d2c12ffcbf9099f95bfb9cf8f08f949b695e22fb0018e8895e088f4a88b6afd"
    with pytest.raises(ChecksumMismatchError) as error:
        load_longclip(checkpoint, head_width=HEAD_WIDTH)
    message = str(error.value)
    for needle in (LONGCLIP_L_SHA256, CURRENT_COMMIT, "1,711,923,133 bytes",
                   "hnclip --profile paper download longclip_l",
                   f"https://huggingface.co/BeichenZhang/LongCLIP-L/resolve/{CURRENT_COMMIT}/longclip-L.pt"):
        assert needle in message
    assert "first upload" not in message  # an unknown file is not called the superseded one


def test_the_current_release_loads_with_the_default_pin(checkpoint, tmp_path):
    path = _verified_as(checkpoint, tmp_path, LONGCLIP_L_SHA256)
    assert load_longclip(path, head_width=HEAD_WIDTH).sha256 == LONGCLIP_L_SHA256


def test_the_superseded_first_upload_is_refused_naming_the_current_release(checkpoint, tmp_path):
    path = _verified_as(checkpoint, tmp_path, FIRST_UPLOAD_SHA256)
    with pytest.raises(ChecksumMismatchError) as error:
        load_longclip(path, head_width=HEAD_WIDTH)
    message = str(error.value)
    assert "first upload of Long-CLIP-L, from before the DDP fix" in message
    assert CURRENT_COMMIT in message and f"sha256 {LONGCLIP_L_SHA256}" in message
    assert "92e2948" not in message  # never points back to the superseded commit


def test_hash_mismatch_can_be_opted_out_explicitly(checkpoint):
    with pytest.warns(UserWarning, match="verify_hash=False"):
        result = load_longclip(checkpoint, expected_sha256="0" * 64, verify_hash=False, head_width=HEAD_WIDTH)
    assert result.sha256 == sha256_file(checkpoint)


# ---------------------------------------------------------------------------------------------
# The download marker: verified once by `hnclip download`, trusted by loads, re-hashed by the audit
# ---------------------------------------------------------------------------------------------

@pytest.fixture
def hash_calls(monkeypatch) -> list[str]:
    """Every file hash computed from here on (the names data.verified_files and the hashing module use)."""
    calls = []

    def counted(function):
        def wrapper(path, *args, **kwargs):
            calls.append(str(path))
            return function(path, *args, **kwargs)
        return wrapper

    for module in (verified_files, hashing):
        for name in ("sha256_file", "hash_file"):
            monkeypatch.setattr(module, name, counted(getattr(module, name)))
    return calls


def _downloaded(directory, state_dict) -> tuple[str, str]:
    """A checkpoint and the `.complete` marker `hnclip download` leaves once it verified it."""
    path = directory / "longclip-L.pt"
    torch.save(state_dict, path)
    sha = sha256_file(path)
    assert verified_files.verify_existing(path, sha) and verified_files.read_marker(path)["sha256"] == sha
    return path, sha


def _replace_content(path, state_dict, keep_mtime: bool) -> str:
    """Write other weights of the same shapes (same size); keep the old mtime, or move it on."""
    before = path.stat()
    torch.save(state_dict, path)
    assert path.stat().st_size == before.st_size
    mtime = before.st_mtime_ns if keep_mtime else before.st_mtime_ns + 10**9
    os.utime(path, ns=(mtime, mtime))
    return sha256_file(path)


def test_load_trusts_a_valid_marker_and_does_not_rehash(tmp_path, longclip_sd, hash_calls):
    path, sha = _downloaded(tmp_path, longclip_sd)
    hash_calls.clear()
    assert load_longclip(path, expected_sha256=sha, head_width=HEAD_WIDTH).sha256 == sha
    with pytest.raises(ChecksumMismatchError, match="0000000000"):  # a pin the marker contradicts: refused
        load_longclip(path, expected_sha256="0" * 64, head_width=HEAD_WIDTH)
    assert hash_calls == []


def test_a_changed_file_is_rehashed_and_a_wrong_hash_refused(tmp_path, longclip_sd, hash_calls):
    path, sha = _downloaded(tmp_path, longclip_sd)
    new_sha = _replace_content(path, make_longclip_state_dict(seed=1), keep_mtime=False)
    hash_calls.clear()
    with pytest.raises(ChecksumMismatchError, match=f"sha256 {new_sha} != expected {sha}"):
        load_longclip(path, expected_sha256=sha, head_width=HEAD_WIDTH)
    assert hash_calls == [str(path)]  # the marker no longer describes the file: re-hashed
    assert load_longclip(path, expected_sha256=new_sha, head_width=HEAD_WIDTH).sha256 == new_sha


def test_audit_rehashes_a_download_its_marker_still_vouches_for(tmp_path, params, longclip_sd):
    """Only the audit notices content changed behind an intact marker (same size and mtime)."""
    data_root = params["profiles"]["paper"]["data_root"]
    raw = tmp_path / data_root / "longclip_l" / "raw"
    raw.mkdir(parents=True)
    path, sha = _downloaded(raw, longclip_sd)
    registry = Registry(params, validate=False)
    assert audit(tmp_path, registry) == []
    new_sha = _replace_content(path, make_longclip_state_dict(seed=1), keep_mtime=True)
    assert load_longclip(path, expected_sha256=sha, head_width=HEAD_WIDTH).sha256 == sha  # the marker is trusted
    relative = f"{data_root}/longclip_l/raw/longclip-L.pt"
    mismatch, = audit(tmp_path, registry)
    assert (mismatch.artifact, mismatch.path) == (f"{relative}.complete", relative)
    assert (mismatch.recorded_sha256, mismatch.actual_sha256) == (sha, new_sha)
    assert "changed since the record was written" in mismatch.message


# ---------------------------------------------------------------------------------------------
# Stretching
# ---------------------------------------------------------------------------------------------

def longclip_stretch_loop(pe):
    """Transcription of Long-CLIP's load_from_clip loop (keep_len 20)."""
    length, dim = pe.shape
    keep = 20
    new = torch.zeros(4 * length - 3 * keep, dim)
    for i in range(keep):
        new[i] = pe[i]
    for i in range(length - 1 - keep):
        new[4 * i + keep] = pe[i + keep]
        new[4 * i + 1 + keep] = 3 * pe[i + keep] / 4 + 1 * pe[i + 1 + keep] / 4
        new[4 * i + 2 + keep] = 2 * pe[i + keep] / 4 + 2 * pe[i + 1 + keep] / 4
        new[4 * i + 3 + keep] = 1 * pe[i + keep] / 4 + 3 * pe[i + 1 + keep] / 4
    for k in range(4):
        new[4 * length - 3 * keep - 4 + k] = pe[length - 1] + k * (pe[length - 1] - pe[length - 2]) / 4
    return new


def test_stretch_on_a_ramp():
    ramp = torch.arange(77, dtype=torch.float32)[:, None].repeat(1, 3)
    stretched = stretch_positional_embedding(ramp)
    assert stretched.shape == (248, 3)
    assert torch.equal(stretched[:20], ramp[:20])
    for i in range(57):  # i = 56 is the extrapolated tail (rows 244..247)
        for k in range(4):
            row = 20 + 4 * i + k
            if row < 248:
                assert torch.all(stretched[row] == 20 + i + k / 4), row
    assert stretched[244, 0] == 76 and stretched[247, 0] == 76.75


def test_stretch_matches_longclip_loop_on_random_and_curved_input():
    pe = torch.randn(77, 16, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(stretch_positional_embedding(pe), longclip_stretch_loop(pe), atol=1e-6, rtol=0)
    squares = (torch.arange(77, dtype=torch.float32) ** 2)[:, None]
    stretched = stretch_positional_embedding(squares)
    assert torch.equal(stretched[244:, 0], torch.tensor([76 ** 2 + k * (76 ** 2 - 75 ** 2) / 4 for k in range(4)]))


def test_stretched_77_token_state_dict_loads_with_248_context():
    openai_sd = make_longclip_state_dict(context=77, with_res=False)
    stretched = stretch_openai_state_dict(openai_sd)
    assert openai_sd["positional_embedding"].shape == (77, WIDTH)  # input untouched
    model = build_open_clip_from_openai_state_dict(stretched, head_width=HEAD_WIDTH)
    assert model.context_length == 248
    assert model.positional_embedding.shape == (248, WIDTH)
    assert model.attn_mask.shape == (248, 248)
    expected = stretch_positional_embedding(openai_sd["positional_embedding"])
    assert torch.equal(model.positional_embedding.detach(), expected)


def test_stretching_a_longclip_state_dict_is_refused(longclip_sd):
    with pytest.raises(CheckpointMismatchError, match="positional_embedding_res"):
        stretch_openai_state_dict(longclip_sd)
