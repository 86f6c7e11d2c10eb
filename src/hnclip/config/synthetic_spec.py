"""What a synthetic benchmark is, apart from how it is drawn: the generator's vocabulary and version,
each variant's spec with params.yaml's `generator:` overrides, and the fingerprint of a dataset.

The registry reads the fingerprint to give runs content-addressed ids before any data exists; the
builder (`hnclip.data.synthetic`) draws scenes and captions from these specs. The fingerprint names the
builder and its version, so a change to the drawing code that changes output bytes bumps
GENERATOR_VERSION here.
"""
from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from importlib.metadata import version as _version

from hnclip.hashing import json_sha256

GENERATOR_VERSION = 2  # bump whenever output bytes change for the same arguments

# ---------------------------------------------------------------------------------------------
# Visual vocabulary
# ---------------------------------------------------------------------------------------------

SHAPES = ("circle", "square", "triangle", "diamond", "cross", "ring", "star", "crescent")
COLORS = {
    "red": (215, 35, 35),
    "orange": (245, 140, 20),
    "yellow": (240, 215, 35),
    "green": (40, 165, 60),
    "blue": (40, 80, 215),
    "purple": (135, 50, 175),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SIZES = {"small": 0.27, "medium": 0.36, "large": 0.46}  # radius as a fraction of a grid cell
TEXTURES = ("solid", "striped", "dotted", "checkered")
CELLS = ("top left", "top center", "top right",
         "middle left", "center", "middle right",
         "bottom left", "bottom center", "bottom right")
MAX_OFFSET = 0.03  # jitter of an object's centre, in cells; small so a large object stays in its cell

STANDARD_BACKGROUNDS = ("plain gray", "pale sand", "dark slate", "teal gradient", "dusk gradient",
                        "grainy noise")
URBAN_BACKGROUNDS = ("brick wall", "asphalt", "street", "concrete tiles", "glass facade")

EDIT_KINDS = ("color", "shape", "texture", "size", "position")


@dataclass(frozen=True)
class VariantSpec:
    """How one benchmark role is generated."""
    splits: tuple[str, ...]
    family_size: int                 # 1 = independent scenes
    n_objects: tuple[int, int]       # inclusive range
    style: str | tuple               # caption style (terse, flowing, ...), or a mixture: ((style, share), ...)
    word_range: tuple[int, int]      # target caption length in words (inclusive)
    backgrounds: tuple[str, ...]
    color_weights: tuple[float, ...] | None = None  # in COLORS order; None = uniform
    short_captions: bool = False
    long_split: str | None = None    # extra split: the test scenes with full-length captions


@dataclass(frozen=True)
class HeldOutSpec(VariantSpec):
    """A variant holding perceivable details out of what it shows: edit kinds its families never make, colours it
    never draws (e.g. a pretraining corpus whose pairs never differ in colour, so that fine-tuning on the benchmarks
    has something left to teach). Built only when params.yaml asks for a hold-out, so that every other spec keeps
    exactly its fields, and with them its dataset fingerprint."""
    edit_kinds: tuple[str, ...] = EDIT_KINDS      # the edits a family's siblings may make (EDIT_KINDS order)
    held_out_colors: tuple[str, ...] = ()         # never drawn, for objects or colour edits (COLORS order)


def edit_kinds_of(spec: VariantSpec) -> tuple[str, ...]:
    return spec.edit_kinds if isinstance(spec, HeldOutSpec) else EDIT_KINDS


def held_out_colors_of(spec: VariantSpec) -> tuple[str, ...]:
    return spec.held_out_colors if isinstance(spec, HeldOutSpec) else ()


VARIANTS: dict[str, VariantSpec] = {
    # Backbone pretraining corpus, broad like Long-CLIP's: every background (the urban ones too),
    # near-duplicate pairs so attributes matter, terse captions in their own wording.
    "pretrain": VariantSpec(("train", "test"), 2, (2, 6), "terse", (30, 80),
                            STANDARD_BACKGROUNDS + URBAN_BACKGROUNDS),
    "docci": VariantSpec(("train", "test"), 4, (4, 7), "flowing", (60, 150), STANDARD_BACKGROUNDS),
    # DCI: region-by-region captions, a one-sentence summary, and Long-DCI's full-length test split.
    "dci": VariantSpec(("train", "test", "test_long"), 4, (3, 6), "regions", (60, 150),
                       STANDARD_BACKGROUNDS, short_captions=True, long_split="test_long"),
    "vg": VariantSpec(("train",), 4, (3, 6), "paragraph", (50, 90), STANDARD_BACKGROUNDS),
    # Urban-1K: shifted distribution -- new backgrounds, more objects, skewed colours.
    "urban": VariantSpec(("test",), 4, (5, 8), "flowing", (80, 150), URBAN_BACKGROUNDS,
                         color_weights=(0.14, 0.08, 0.12, 0.05, 0.10, 0.03, 0.24, 0.24)),
}


CAPTION_STYLE_NAMES = ("terse", "flowing", "regions", "paragraph", "simple")  # the builder's CAPTION_STYLES
# What params.yaml may change of a variant (a synthetic dataset's `generator:` entry); the last two hold a
# detail out (HeldOutSpec).
GENERATOR_OVERRIDES = ("style", "family_size", "edit_kinds", "held_out_colors")
HOLD_OUTS = ("edit_kinds", "held_out_colors")


def style_of(style) -> str | tuple[tuple[str, float], ...]:
    """A `generator: style` as the spec holds it: a style's name, or a mixture {style: share} (shares > 0,
    summing to 1) as ((style, share), ...) in CAPTION_STYLE_NAMES order, so that one mixture always names
    the same dataset; a mixture of one style is that style."""
    if isinstance(style, str):
        if style not in CAPTION_STYLE_NAMES:
            raise ValueError(f"unknown caption style {style!r}; allowed: {', '.join(CAPTION_STYLE_NAMES)}")
        return style
    if not isinstance(style, dict) or not style:
        raise ValueError(f"a caption style is a name or a mixture {{style: share}}, got {style!r}")
    unknown = sorted(set(style) - set(CAPTION_STYLE_NAMES))
    if unknown:
        raise ValueError(f"unknown caption style(s) {unknown} in the mixture; "
                         f"allowed: {', '.join(CAPTION_STYLE_NAMES)}")
    shares = dict(style)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in shares.values()):
        raise ValueError(f"each share of a caption-style mixture must be a positive number, got {style!r}")
    if abs(sum(shares.values()) - 1.0) > 1e-6:
        raise ValueError(f"the shares of a caption-style mixture must sum to 1, got {sum(shares.values()):g}")
    mixture = tuple((name, float(shares[name])) for name in CAPTION_STYLE_NAMES if name in shares)
    return mixture[0][0] if len(mixture) == 1 else mixture


def _in_order(values, allowed, what: str) -> tuple[str, ...]:
    """`values` as a tuple in the vocabulary's order (the same set always draws the same scenes)."""
    if isinstance(values, str) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{what} must be a list of names, got {values!r}")
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; allowed: {', '.join(allowed)}")
    return tuple(v for v in allowed if v in values)


def _with_hold_outs(spec: VariantSpec, generator: dict) -> VariantSpec:
    """`spec` with the hold-out overrides applied: a HeldOutSpec only when one holds something out."""
    kinds = _in_order(generator.get("edit_kinds", EDIT_KINDS), EDIT_KINDS, "edit_kinds")
    held_out = _in_order(generator.get("held_out_colors", ()), list(COLORS), "held_out_colors")
    if not kinds:
        raise ValueError(f"edit_kinds must name at least one of {', '.join(EDIT_KINDS)}")
    if spec.family_size - 1 > len(kinds):
        raise ValueError(f"family_size {spec.family_size} needs {spec.family_size - 1} distinct edit kinds per family, "
                         f"but edit_kinds allows {len(kinds)} ({', '.join(kinds)})")
    drawn = [c for c, w in zip(COLORS, spec.color_weights or [1.0] * len(COLORS)) if w > 0 and c not in held_out]
    if len(drawn) < 2:
        raise ValueError(f"held_out_colors {list(held_out)} leaves {len(drawn)} colour(s) to draw; keep at least two")
    if kinds == EDIT_KINDS and not held_out:
        return spec
    return HeldOutSpec(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(VariantSpec)},
                       edit_kinds=kinds, held_out_colors=held_out)


def variant_spec(variant: str, generator: dict | None = None) -> VariantSpec:
    """A variant's spec with params.yaml's `generator` overrides (caption style, family size, hold-outs) applied."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    generator = dict(generator or {})
    unknown = sorted(set(generator) - set(GENERATOR_OVERRIDES))
    if unknown:
        raise ValueError(f"unknown generator setting(s) {unknown}; allowed: {', '.join(GENERATOR_OVERRIDES)}")
    if "style" in generator:
        generator["style"] = style_of(generator["style"])
    family_size = generator.get("family_size", 1)
    if not isinstance(family_size, int) or not 1 <= family_size <= len(EDIT_KINDS) + 1:
        raise ValueError(f"family_size must be an integer from 1 to {len(EDIT_KINDS) + 1} (a base scene and "
                         f"one scene per edit kind), got {family_size!r}")
    plain = {key: value for key, value in generator.items() if key not in HOLD_OUTS}
    return _with_hold_outs(dataclasses.replace(VARIANTS[variant], **plain), generator)


def check_variant_split(variant: str, split: str | None = None, generator: dict | None = None) -> VariantSpec:
    spec = variant_spec(variant, generator)
    if split is not None and split not in spec.splits:
        raise ValueError(f"unknown split {split!r} for variant {variant!r}; allowed: {', '.join(spec.splits)}")
    return spec


def check_sizes(variant: str, sizes: dict[str, int], generator: dict | None = None) -> VariantSpec:
    spec = check_variant_split(variant, generator=generator)
    if not sizes:
        raise ValueError(f"no splits requested for {variant!r}; allowed: {', '.join(spec.splits)}")
    for split, n in sizes.items():
        check_variant_split(variant, split)
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"size of split {split!r} must be a positive integer, got {n!r}")
    if spec.long_split in sizes and "test" in sizes and sizes[spec.long_split] != sizes["test"]:
        raise ValueError(f"{spec.long_split!r} re-describes the 'test' images, so their sizes must match")
    return spec


def splits_to_write(spec: VariantSpec, sizes: dict[str, int]) -> dict[str, int]:
    """The requested splits, plus the long-caption split whenever 'test' is requested."""
    splits = dict(sizes)
    if spec.long_split and "test" in sizes:
        splits.setdefault(spec.long_split, sizes["test"])
    return splits


def dataset_fingerprint(variant: str, sizes: dict[str, int], seed: int, image_size: int = 64,
                        generator: dict | None = None) -> dict:
    """Everything that determines a written dataset, for provenance; `digest` hashes the rest."""
    spec = check_sizes(variant, sizes, generator)
    described = {
        "generator": f"hnclip.data.synthetic@{GENERATOR_VERSION}",  # the builder's name and version
        "variant": variant,
        "sizes": dict(sorted(splits_to_write(spec, sizes).items())),
        "seed": int(seed),
        "image_size": int(image_size),
        "spec": dataclasses.asdict(spec),
        "vocabulary": {"shapes": list(SHAPES), "colors": {k: list(v) for k, v in COLORS.items()},
                       "sizes": SIZES, "textures": list(TEXTURES), "cells": list(CELLS),
                       "edit_kinds": list(EDIT_KINDS)},
        # PNG bytes depend on Pillow and zlib, random streams on numpy
        "libraries": {"numpy": _version("numpy"), "pillow": _version("pillow"), "zlib": zlib.ZLIB_RUNTIME_VERSION},
    }
    return {**described, "digest": json_sha256(described)}
