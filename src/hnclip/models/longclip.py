"""Long-CLIP checkpoints as strictly loaded, fp32 open_clip `CLIP` models.

The released `longclip-L.pt` (HF `BeichenZhang/LongCLIP-L`) is an OpenAI-CLIP-format state dict
with one Long-CLIP twist: the text positional embedding is stored as two 248-row tensors.
Long-CLIP's `encode_text` adds `positional_embedding * mask1 + positional_embedding_res * mask2`
(mask1 = rows 0-19, mask2 = rows 20-247), so the effective embedding is
`cat(positional_embedding[:20], positional_embedding_res[20:])`. Merging the two (bit-exact: the
masks are 0/1) gives a plain OpenAI layout that open_clip's `CLIP` loads with strict key checking.

Baselines that start from OpenAI CLIP (GOAL, FineLIP) use Long-CLIP's "knowledge-preserved
stretching" of the 77-row embedding to 248 rows: `stretch_openai_state_dict`.

Loading never uses `strict=False` and never goes through open_clip's
`build_model_from_openai_state_dict` (it casts to fp16 and hard-codes heads): a missing,
unexpected or mis-shaped key raises `CheckpointMismatchError` naming every offending key.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import torch
from open_clip.model import CLIP
from open_clip.tokenizer import SimpleTokenizer
from open_clip.transform import image_transform

from hnclip.data.sources import LONGCLIP_L, LONGCLIP_L_SHA256  # noqa: F401 - the current release's pin
from hnclip.data.verified_files import recorded_sha256
from hnclip.errors import UserError
from hnclip.runtime.device import resolve_device

KEEP_LEN = 20  # rows served by `positional_embedding` / kept verbatim by the stretch
STRETCH_FACTOR = 4  # 77 OpenAI rows -> 4 * 77 - 3 * KEEP_LEN = 248 (config.constants.CONTEXT_LENGTH)
OPENAI_HEAD_WIDTH = 64  # OpenAI CLIP (and Long-CLIP's build_model): heads = width // 64, both towers

# Non-weight entries that OpenAI's JIT archives carry; OpenAI, Long-CLIP and open_clip all drop them.
OPENAI_METADATA_KEYS = ("input_resolution", "context_length", "vocab_size")
PE_KEY = "positional_embedding"
PE_RES_KEY = "positional_embedding_res"


class CheckpointMismatchError(UserError, ValueError):
    """A state dict does not match the model it is loaded into; lists every offending key."""

    def __init__(self, missing=(), unexpected=(), mismatched=(), context: str = ""):
        self.missing = list(missing)
        self.unexpected = list(unexpected)
        self.mismatched = list(mismatched)  # (key, checkpoint shape, model shape)
        lines = [f"checkpoint does not match the model{': ' + context if context else ''}"]
        lines += [f"  missing key: {key}" for key in self.missing]
        lines += [f"  unexpected key: {key}" for key in self.unexpected]
        lines += [f"  shape mismatch: {key}: checkpoint {got} vs model {want}"
                  for key, got, want in self.mismatched]
        super().__init__("\n".join(lines))


class ChecksumMismatchError(UserError, ValueError):
    """A checkpoint file's sha256 differs from the pinned one."""


# ---------------------------------------------------------------------------------------------
# Positional-embedding surgery
# ---------------------------------------------------------------------------------------------

def convert_longclip_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Merge Long-CLIP's two text PEs into one `positional_embedding`; drop `positional_embedding_res`.

    Returns a new dict (the input is not modified); all other entries are passed through.
    """
    missing = [key for key in (PE_KEY, PE_RES_KEY) if key not in state_dict]
    if missing:
        raise CheckpointMismatchError(missing=missing, context="not a Long-CLIP state dict")
    pe, pe_res = state_dict[PE_KEY], state_dict[PE_RES_KEY]
    if pe.shape != pe_res.shape or pe.shape[0] <= KEEP_LEN:
        raise CheckpointMismatchError(
            mismatched=[(PE_RES_KEY, tuple(pe_res.shape), tuple(pe.shape))],
            context=f"{PE_KEY} and {PE_RES_KEY} must have equal shapes with more than {KEEP_LEN} rows")
    converted = {key: value for key, value in state_dict.items() if key != PE_RES_KEY}
    converted[PE_KEY] = torch.cat([pe[:KEEP_LEN], pe_res[KEEP_LEN:]], dim=0)
    return converted


def stretch_positional_embedding(pe: torch.Tensor) -> torch.Tensor:
    """Long-CLIP's knowledge-preserved stretching (`model/longclip.py::load_from_clip`), L -> 4L-60 rows.

    For L = 77 rows (result 248), computed in fp32:
      new[0..19]      = orig[0..19]
      new[20+4i+k]    = ((4-k) * orig[20+i] + k * orig[21+i]) / 4,     i = 0..55, k = 0..3  (rows 20..243)
      new[244+k]      = orig[76] + k * (orig[76] - orig[75]) / 4,      k = 0..3             (rows 244..247)
    Ambiguity resolved from the source: the tail uses k = 0..3 (its first row is orig[76] itself),
    not k = 1..4; with k = 0..3 a linear ramp stays exactly linear through row 247. Long-CLIP ran the
    stretch in the model dtype (fp16 for OpenAI weights); fp32 here differs by fp16 rounding only.
    """
    if pe.ndim != 2 or pe.shape[0] < KEEP_LEN + 2:
        raise ValueError(f"expected a [L, W] positional embedding with L >= {KEEP_LEN + 2}, got {tuple(pe.shape)}")
    pe = pe.float()
    steps = torch.arange(STRETCH_FACTOR, dtype=pe.dtype, device=pe.device) / STRETCH_FACTOR  # 0, 1/4, 2/4, 3/4
    left, right = pe[KEEP_LEN:-1], pe[KEEP_LEN + 1:]
    interpolated = left[:, None, :] * (1 - steps)[None, :, None] + right[:, None, :] * steps[None, :, None]
    last_step = pe[-1] - pe[-2]
    extrapolated = pe[-1][None, :] + steps[:, None] * last_step[None, :]
    return torch.cat([pe[:KEEP_LEN], interpolated.reshape(-1, pe.shape[1]), extrapolated], dim=0)


def stretch_openai_state_dict(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An OpenAI CLIP state dict (77-token text PE) with its text PE stretched to 248 rows."""
    if PE_RES_KEY in state_dict:
        raise CheckpointMismatchError(unexpected=[PE_RES_KEY],
                                      context="already a Long-CLIP state dict; use convert_longclip_state_dict")
    if PE_KEY not in state_dict:
        raise CheckpointMismatchError(missing=[PE_KEY])
    stretched = dict(state_dict)
    stretched[PE_KEY] = stretch_positional_embedding(state_dict[PE_KEY])
    return stretched


# ---------------------------------------------------------------------------------------------
# Architecture inference and strict loading
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpenAIArchitecture:
    """The shape of an OpenAI-layout ViT CLIP, as inferred from its state dict."""
    embed_dim: int
    image_size: int
    patch_size: int
    vision_width: int
    vision_layers: int
    vision_heads: int
    vision_mlp_ratio: float
    context_length: int
    vocab_size: int
    text_width: int
    text_layers: int
    text_heads: int
    text_mlp_ratio: float

    def open_clip_configs(self, block_type: str | None = None) -> tuple[dict, dict]:
        """(vision_cfg, text_cfg) for `open_clip.model.CLIP`; block_type None/'default' or 'custom'."""
        vision_cfg = dict(image_size=self.image_size, patch_size=self.patch_size, width=self.vision_width,
                          layers=self.vision_layers, head_width=self.vision_width // self.vision_heads,
                          mlp_ratio=self.vision_mlp_ratio, block_type=block_type)
        text_cfg = dict(context_length=self.context_length, vocab_size=self.vocab_size, width=self.text_width,
                        layers=self.text_layers, heads=self.text_heads, mlp_ratio=self.text_mlp_ratio,
                        block_type=block_type)
        return vision_cfg, text_cfg


def _require(state_dict: Mapping, *keys: str) -> None:
    missing = [key for key in keys if key not in state_dict]
    if missing:
        raise CheckpointMismatchError(missing=missing, context="cannot infer the architecture")


def _layer_count(state_dict: Mapping, prefix: str) -> int:
    # Count distinct block indices (a block with missing keys is caught by the strict check later).
    indices = {key[len(prefix):].split(".", 1)[0] for key in state_dict if key.startswith(prefix)}
    return len(indices)


def _heads(width: int, head_width: int, tower: str) -> int:
    if width % head_width:
        raise ValueError(f"{tower} width {width} is not a multiple of head_width {head_width}")
    return width // head_width


def infer_architecture(state_dict: Mapping[str, torch.Tensor],
                       head_width: int = OPENAI_HEAD_WIDTH) -> OpenAIArchitecture:
    """Infer a ViT CLIP's shape from OpenAI-layout keys.

    Heads cannot be read from the weights; like OpenAI's and Long-CLIP's `build_model`, they are
    `width // head_width` with head_width 64 (ViT-L/14: 16 vision heads, 12 text heads).
    """
    if "visual.proj" not in state_dict and "visual.attnpool.positional_embedding" in state_dict:
        raise NotImplementedError("ResNet (ModifiedResNet) visual towers are not supported")
    _require(state_dict, "visual.conv1.weight", "visual.positional_embedding", "text_projection",
             PE_KEY, "token_embedding.weight", "ln_final.weight",
             "visual.transformer.resblocks.0.mlp.c_fc.weight", "transformer.resblocks.0.mlp.c_fc.weight")
    conv = state_dict["visual.conv1.weight"]
    vision_width, patch_size = conv.shape[0], conv.shape[-1]
    n_vision_positions = state_dict["visual.positional_embedding"].shape[0]
    grid = round((n_vision_positions - 1) ** 0.5)
    if grid * grid + 1 != n_vision_positions:
        raise CheckpointMismatchError(
            mismatched=[("visual.positional_embedding", tuple(state_dict["visual.positional_embedding"].shape),
                         "(grid**2 + 1, width)")])
    text_width = state_dict["ln_final.weight"].shape[0]
    return OpenAIArchitecture(
        embed_dim=state_dict["text_projection"].shape[1],
        image_size=patch_size * grid,
        patch_size=patch_size,
        vision_width=vision_width,
        vision_layers=_layer_count(state_dict, "visual.transformer.resblocks."),
        vision_heads=_heads(vision_width, head_width, "vision"),
        vision_mlp_ratio=state_dict["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0] / vision_width,
        context_length=state_dict[PE_KEY].shape[0],
        vocab_size=state_dict["token_embedding.weight"].shape[0],
        text_width=text_width,
        text_layers=_layer_count(state_dict, "transformer.resblocks."),
        text_heads=_heads(text_width, head_width, "text"),
        text_mlp_ratio=state_dict["transformer.resblocks.0.mlp.c_fc.weight"].shape[0] / text_width,
    )


def build_clip(architecture: OpenAIArchitecture, quick_gelu: bool = True, block_type: str | None = None) -> CLIP:
    """An fp32, randomly initialized open_clip `CLIP` of the given shape (OpenAI weights need QuickGELU)."""
    vision_cfg, text_cfg = architecture.open_clip_configs(block_type)
    return CLIP(architecture.embed_dim, vision_cfg=vision_cfg, text_cfg=text_cfg, quick_gelu=quick_gelu,
                cast_dtype=None)


def check_state_dict_matches(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Raise `CheckpointMismatchError` unless keys and shapes equal `model.state_dict()`'s exactly."""
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    missing = sorted(expected.keys() - state_dict.keys())
    unexpected = sorted(state_dict.keys() - expected.keys())
    mismatched = []
    for key in sorted(expected.keys() & state_dict.keys()):
        value = state_dict[key]
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        if got != expected[key]:
            mismatched.append((key, got, expected[key]))
    if missing or unexpected or mismatched:
        raise CheckpointMismatchError(missing, unexpected, mismatched)


def load_state_dict_strictly(model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """Check every key and shape ourselves (clear error), then `load_state_dict(strict=True)`."""
    check_state_dict_matches(model, state_dict)
    model.load_state_dict(state_dict, strict=True)  # copies (and casts) into the model's fp32 tensors
    return model


def drop_openai_metadata(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: value for key, value in state_dict.items() if key not in OPENAI_METADATA_KEYS}


def build_open_clip_from_openai_state_dict(state_dict: Mapping[str, torch.Tensor], head_width: int = OPENAI_HEAD_WIDTH,
                                           quick_gelu: bool = True, block_type: str | None = None) -> CLIP:
    """open_clip `CLIP` (fp32, eval mode) with the inferred architecture and the weights loaded strictly.

    For longclip-L.pt (after `convert_longclip_state_dict`) this is ViT-L-14-quickgelu with context 248.
    """
    state_dict = drop_openai_metadata(state_dict)
    model = build_clip(infer_architecture(state_dict, head_width), quick_gelu=quick_gelu, block_type=block_type)
    load_state_dict_strictly(model, state_dict)
    return model.float().eval()


# ---------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------

def _longclip_l_advice(path: str | Path, actual: str) -> str:
    """What the file is, if it is a superseded Long-CLIP-L upload, and how to get the current release."""
    weights = LONGCLIP_L.file("longclip-L.pt")
    old = weights.superseded_by_this(actual)
    return ((f". This is {old.what}" if old else "")
            + f". The current Long-CLIP-L release is {weights.hub_repo} at commit {weights.revision} "
              f"(sha256 {weights.checksum}, {weights.size:,} bytes): run `hnclip --profile paper download "
              f"longclip_l`, or download {weights.url} and put it at {path}")


def verify_sha256(path: str | Path, expected_sha256: str | None, verify_hash: bool = True) -> str:
    """Return the file's sha256; raise on a mismatch with `expected_sha256` unless verify_hash=False."""
    actual = recorded_sha256(path)  # the download's .complete marker, while the file is unchanged
    if expected_sha256 is not None and actual != expected_sha256.lower():
        message = f"{path}: sha256 {actual} != expected {expected_sha256}"
        if expected_sha256.lower() == LONGCLIP_L_SHA256:
            message += _longclip_l_advice(path, actual)
        if verify_hash:
            raise ChecksumMismatchError(message + " (pass verify_hash=False to load it anyway)")
        warnings.warn(message + " (verify_hash=False: loading anyway)", stacklevel=3)
    return actual


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors (CPU, weights_only): plain dict, a `state_dict` wrapper, or DDP `module.` keys."""
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(loaded, Mapping) and "state_dict" in loaded and isinstance(loaded["state_dict"], Mapping):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, Mapping):
        raise TypeError(f"{path}: expected a state dict, got {type(loaded).__name__}")
    if loaded and all(key.startswith("module.") for key in loaded):
        loaded = {key[len("module."):]: value for key, value in loaded.items()}
    return dict(loaded)


# ---------------------------------------------------------------------------------------------
# The public loader
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LongCLIP:
    """What `load_longclip` returns.

    model:      open_clip `CLIP`, fp32, eval mode, on the requested device; context_length 248.
    preprocess: PIL image -> [3, S, S] tensor (resize shortest side bicubic, center crop, OpenAI mean/std),
                S inferred from the weights (224 for Long-CLIP-L); identical to Long-CLIP's `_transform`.
    tokenizer:  open_clip `SimpleTokenizer` with the model's context length; texts longer than it are
                truncated with EOT kept last (= `longclip.tokenize(..., truncate=True)`).
    sha256:     the checkpoint file's sha256 (for provenance records).
    """
    model: CLIP
    preprocess: Callable
    tokenizer: SimpleTokenizer
    sha256: str


def load_longclip(path: str | Path, device: str | torch.device = "cpu",  # "auto" allowed (hnclip.runtime.device)
                  expected_sha256: str | None = LONGCLIP_L_SHA256, verify_hash: bool = True,
                  head_width: int = OPENAI_HEAD_WIDTH) -> LongCLIP:
    """Load a Long-CLIP checkpoint (released layout, with `positional_embedding_res`) into open_clip.

    By default the file must be the current Long-CLIP-L release (`LONGCLIP_L_SHA256`, HF commit
    a298569; the superseded first upload is refused with a message saying so); for any other file
    pass its own `expected_sha256`, or `expected_sha256=None` / `verify_hash=False` to skip the pin.
    """
    sha256 = verify_sha256(path, expected_sha256, verify_hash)
    state_dict = convert_longclip_state_dict(read_state_dict(path))
    model = build_open_clip_from_openai_state_dict(state_dict, head_width=head_width).to(resolve_device(device))
    preprocess = image_transform(model.visual.image_size, is_train=False)  # defaults: bicubic, OpenAI mean/std
    tokenizer = SimpleTokenizer(context_length=model.context_length)
    return LongCLIP(model=model, preprocess=preprocess, tokenizer=tokenizer, sha256=sha256)
