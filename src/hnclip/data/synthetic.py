"""Procedurally generated dense-caption benchmarks: the CPU miniature of DOCCI / DCI / Long-DCI /
VG paragraphs / Urban-1K, plus a separate corpus for pretraining the tiny backbone.

A scene is a few textured shapes in the cells of a 3x3 grid over a named background. It is
rendered with numpy masks (no antialiasing) and described by templated captions. Every attribute
a caption mentions (shape, colour, size, texture, grid cell, background) is visible in the image,
so retrieval is solvable.

Fine-tuning benchmarks come in *families*: a base scene plus siblings that differ from it in one
edit (one object's colour, shape, texture or size, or two objects swapping cells). Siblings share
their caption templates, so their captions are near-duplicates, like the hard negatives of real
dense-caption benchmarks. Rows are shuffled so that siblings are never adjacent in a manifest.

Everything is a pure function of (seed, variant, split): the same arguments give byte-identical
PNGs and manifests; train and test draw from distinct seed streams.
"""
from __future__ import annotations

import dataclasses
import functools
import io
import math
import os
import re
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from hnclip.config.synthetic_spec import (  # noqa: F401 - the spec's names are part of this module's API
    CAPTION_STYLE_NAMES,
    CELLS,
    COLORS,
    EDIT_KINDS,
    GENERATOR_OVERRIDES,
    GENERATOR_VERSION,
    MAX_OFFSET,
    SHAPES,
    SIZES,
    STANDARD_BACKGROUNDS,
    TEXTURES,
    URBAN_BACKGROUNDS,
    VARIANTS,
    HeldOutSpec,
    VariantSpec,
    check_sizes,
    check_variant_split,
    dataset_fingerprint,
    edit_kinds_of,
    held_out_colors_of,
    splits_to_write,
    variant_spec,
)
from hnclip.data.manifest import ManifestRow, write_manifest
from hnclip.hashing import sha256_bytes

# The vocabulary, the variants and the fingerprint: hnclip.config.synthetic_spec (the registry reads them).


@dataclass(frozen=True)
class SceneObject:
    shape: str
    color: str
    size: str
    texture: str
    cell: int                        # index into CELLS (row-major)
    offset: tuple[float, float]      # (dx, dy) jitter of the centre, in cells

    def appearance(self) -> tuple[str, str, str, str]:
        return (self.shape, self.color, self.size, self.texture)


@dataclass(frozen=True)
class Scene:
    background: str
    background_seed: int             # seeds the noise of noisy backgrounds; shared by siblings
    objects: tuple[SceneObject, ...]


@dataclass(frozen=True, eq=False)
class Sample:
    """One generated row: the scene, its rendered image and its captions."""
    id: str
    split: str
    family: int
    member: int                      # 0 = the family's base scene
    edit: str | None                 # how this member differs from member 0 (None for member 0)
    scene: Scene
    image: np.ndarray                # (H, W, 3) uint8
    caption: str
    short_caption: str | None


# A generated row's id is "<variant>-<scene split>-f<family>-m<member>" (generate_split): siblings
# share everything before "-m", so a manifest carries each row's family in its id.
SAMPLE_ID = re.compile(r"(?P<family>[^-]+-[^-]+-f\d+)-m\d+")


def family_of(sample_id: str) -> str | None:
    """The family of a generated row (its id up to the member suffix), or None for an id this
    generator did not write (real data has no families)."""
    match = SAMPLE_ID.fullmatch(sample_id)
    return match.group("family") if match else None


def scene_differences(a: Scene, b: Scene) -> list[tuple[int, str]]:
    """(object index, attribute) pairs where two scenes with the same object count differ."""
    if len(a.objects) != len(b.objects):
        raise ValueError("scenes have different object counts")
    diffs = [(-1, "background")] if a.background != b.background else []
    for index, (x, y) in enumerate(zip(a.objects, b.objects)):
        diffs += [(index, attr) for attr in ("shape", "color", "size", "texture", "cell")
                  if getattr(x, attr) != getattr(y, attr)]
    return diffs


# ---------------------------------------------------------------------------------------------
# Seeds
# ---------------------------------------------------------------------------------------------

def _stable_int(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


def _split_seeds(seed: int, variant: str, split: str) -> tuple[np.random.SeedSequence, np.random.SeedSequence]:
    """(scene stream, shuffle stream) of one split; distinct splits never share a stream."""
    key = [int(seed), _stable_int(variant), _stable_int(split)]
    return np.random.SeedSequence(key + [0]), np.random.SeedSequence(key + [1])


# ---------------------------------------------------------------------------------------------
# Scenes and family edits
# ---------------------------------------------------------------------------------------------

def _color_probabilities(spec: VariantSpec, exclude: str | None = None) -> np.ndarray:
    weights = np.array(spec.color_weights or [1.0] * len(COLORS), dtype=float)
    for color in held_out_colors_of(spec):
        weights[list(COLORS).index(color)] = 0.0
    if exclude is not None:
        weights[list(COLORS).index(exclude)] = 0.0
    return weights / weights.sum()


def _sample_scene(spec: VariantSpec, rng: np.random.Generator) -> Scene:
    n = int(rng.integers(spec.n_objects[0], spec.n_objects[1] + 1))
    cells = rng.choice(len(CELLS), size=n, replace=False)
    colors = rng.choice(list(COLORS), size=n, p=_color_probabilities(spec))
    objects = tuple(
        SceneObject(shape=str(rng.choice(SHAPES)), color=str(colors[i]), size=str(rng.choice(list(SIZES))),
                    texture=str(rng.choice(TEXTURES)), cell=int(cells[i]),
                    offset=tuple(float(v) for v in rng.uniform(-MAX_OFFSET, MAX_OFFSET, size=2)))
        for i in range(n))
    return Scene(background=str(rng.choice(spec.backgrounds)),
                 background_seed=int(rng.integers(2**31)), objects=objects)


def _other_value(values, current: str, rng: np.random.Generator, p=None) -> str:
    choices = [v for v in values if v != current]
    if p is not None:
        p = np.array([p[list(values).index(v)] for v in choices])
        p = p / p.sum()
    return str(rng.choice(choices, p=p))


def _edit_scene(scene: Scene, kind: str, spec: VariantSpec, rng: np.random.Generator) -> Scene:
    """A sibling of `scene`: one object's attribute changed, or two distinct objects swapping cells."""
    objects = list(scene.objects)
    if kind == "position":
        pairs = [(i, j) for i in range(len(objects)) for j in range(i + 1, len(objects))
                 if objects[i].appearance() != objects[j].appearance()]
        if pairs:
            i, j = pairs[int(rng.integers(len(pairs)))]
            objects[i], objects[j] = (dataclasses.replace(objects[i], cell=objects[j].cell),
                                      dataclasses.replace(objects[j], cell=objects[i].cell))
        else:  # all objects look alike, so a swap would change nothing: move one to a free cell
            free = sorted(set(range(len(CELLS))) - {o.cell for o in objects})
            objects[0] = dataclasses.replace(objects[0], cell=int(rng.choice(free)))
    else:
        i = int(rng.integers(len(objects)))
        current = getattr(objects[i], kind)
        if kind == "color":
            new = _other_value(list(COLORS), current, rng, p=_color_probabilities(spec))
        else:
            new = _other_value({"shape": SHAPES, "texture": TEXTURES, "size": list(SIZES)}[kind], current, rng)
        objects[i] = dataclasses.replace(objects[i], **{kind: new})
    return dataclasses.replace(scene, objects=tuple(objects))


def _family_scenes(spec: VariantSpec, rng: np.random.Generator) -> list[tuple[str | None, Scene]]:
    """[(edit, scene)]: the base scene, then one sibling per distinct edit kind."""
    base = _sample_scene(spec, rng)
    kinds = rng.choice(edit_kinds_of(spec), size=spec.family_size - 1, replace=False)
    return [(None, base)] + [(str(k), _edit_scene(base, str(k), spec, rng)) for k in kinds]


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _pixel_grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(y, x) pixel-centre coordinates."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    return y, x


@functools.lru_cache(maxsize=8)
def _texture_masks(size: int) -> dict[str, np.ndarray]:
    """Where each texture shows its secondary shade, on a 64-px design grid scaled to `size`."""
    y, x = (np.floor(c * 64.0 / size).astype(np.int32) for c in _pixel_grid(size))
    return {
        "solid": np.zeros((size, size), dtype=bool),
        "striped": (y // 2) % 2 == 1,                     # horizontal stripes, period 4 px
        "dotted": (x % 4 == 1) & (y % 4 == 1) | (x % 4 == 2) & (y % 4 == 2),  # sparse dot grid
        "checkered": ((x // 3) + (y // 3)) % 2 == 1,      # 3-px checkerboard
    }


def _shape_mask(shape: str, dx: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """Mask of a unit-radius shape in coordinates relative to its centre (y grows downwards)."""
    ax, ay = np.abs(dx), np.abs(dy)
    if shape == "circle":
        return dx * dx + dy * dy <= 1.0
    if shape == "square":
        return np.maximum(ax, ay) <= 0.8
    if shape == "diamond":
        return ax + ay <= 1.0
    if shape == "triangle":  # apex up
        return (dy >= -1.0) & (dy <= 0.75) & (ax <= (dy + 1.0) * 0.6)
    if shape == "cross":
        return ((ax <= 0.32) & (ay <= 1.0)) | ((ay <= 0.32) & (ax <= 1.0))
    if shape == "ring":
        d2 = dx * dx + dy * dy
        return (d2 <= 1.0) & (d2 >= 0.5 ** 2)
    if shape == "star":  # five points, one straight up
        angle = np.arctan2(dy, dx) + np.pi / 2
        phase = (angle * 5 / (2 * np.pi)) % 1.0
        reach = 0.42 + 0.58 * np.abs(1.0 - 2.0 * phase)
        return dx * dx + dy * dy <= reach * reach
    if shape == "crescent":
        return (dx * dx + dy * dy <= 1.0) & ((dx - 0.45) ** 2 + (dy + 0.1) ** 2 > 0.75 ** 2)
    raise ValueError(f"unknown shape {shape!r}")


def _secondary_shade(rgb: tuple[int, int, int]) -> np.ndarray:
    """The texture's second colour: a darker shade, or a lighter one for very dark colours."""
    color = np.array(rgb, dtype=np.float32)
    if color.mean() < 60:
        return np.round(color + (255 - color) * 0.45).astype(np.uint8)
    return np.round(color * 0.45).astype(np.uint8)


def _draw_object(canvas: np.ndarray, obj: SceneObject) -> None:
    size = canvas.shape[0]
    cell = size / 3.0
    row, col = divmod(obj.cell, 3)
    cx, cy = (col + 0.5 + obj.offset[0]) * cell, (row + 0.5 + obj.offset[1]) * cell
    radius = SIZES[obj.size] * cell
    # Work on the object's bounding window only: ~8x fewer pixels than the whole image.
    y0, y1 = max(0, int(cy - radius) - 1), min(size, int(math.ceil(cy + radius)) + 1)
    x0, x1 = max(0, int(cx - radius) - 1), min(size, int(math.ceil(cx + radius)) + 1)
    ys, xs = _pixel_grid(size)
    window = (slice(y0, y1), slice(x0, x1))
    mask = _shape_mask(obj.shape, (xs[window] - cx) / radius, (ys[window] - cy) / radius)
    shaded = _texture_masks(size)[obj.texture][window]
    primary = np.array(COLORS[obj.color], dtype=np.uint8)
    patch = canvas[window]
    patch[mask] = primary
    patch[mask & shaded] = _secondary_shade(COLORS[obj.color])


def _gradient(size: int, start, end, vertical: bool) -> np.ndarray:
    t = np.linspace(0.0, 1.0, size, dtype=np.float32)
    t = t[:, None, None] if vertical else t[None, :, None]
    ramp = np.array(start, np.float32) * (1 - t) + np.array(end, np.float32) * t
    return np.broadcast_to(ramp, (size, size, 3)).round().astype(np.uint8)


def _flat(size: int, rgb) -> np.ndarray:
    return np.broadcast_to(np.array(rgb, np.uint8), (size, size, 3)).copy()


def _noisy(size: int, rgb, amplitude: int, seed: int, gray: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    noise = rng.integers(-amplitude, amplitude + 1, size=(size, size, 1 if gray else 3))
    return np.clip(np.array(rgb, np.int16) + noise, 0, 255).astype(np.uint8)


def _grid_lines(base: np.ndarray, period: int, rgb, row_shift: int = 0) -> np.ndarray:
    """Draw 1-px lines every `period` px (scaled to the image); row_shift staggers vertical
    lines between rows of tiles, as in brickwork."""
    size = base.shape[0]
    y, x = (np.floor(c * 64.0 / size).astype(np.int32) for c in _pixel_grid(size))
    band = y // (period // 2 if row_shift else period)
    horizontal = y % (period // 2 if row_shift else period) == 0
    vertical = (x + row_shift * (band % 2)) % period == 0
    out = base.copy()
    out[horizontal | vertical] = rgb
    return out


def _street(size: int, seed: int) -> np.ndarray:
    out = _noisy(size, (70, 70, 72), 14, seed, gray=True)
    y, x = (np.floor(c * 64.0 / size).astype(np.int32) for c in _pixel_grid(size))
    out[((y == 20) | (y == 43)) & (x % 10 < 6)] = (230, 200, 60)  # dashed lane markings
    return out


BACKGROUND_RENDERERS: dict[str, Callable[[int, int], np.ndarray]] = {
    "plain gray": lambda s, seed: _flat(s, (128, 128, 128)),
    "pale sand": lambda s, seed: _flat(s, (205, 190, 150)),
    "dark slate": lambda s, seed: _flat(s, (50, 60, 75)),
    "teal gradient": lambda s, seed: _gradient(s, (20, 90, 100), (120, 180, 170), vertical=True),
    "dusk gradient": lambda s, seed: _gradient(s, (70, 40, 100), (190, 110, 90), vertical=False),
    "grainy noise": lambda s, seed: _noisy(s, (110, 125, 110), 28, seed, gray=False),
    # Urban-1K's shifted backgrounds
    "brick wall": lambda s, seed: _grid_lines(_flat(s, (150, 65, 45)), 12, (200, 195, 185), row_shift=6),
    "asphalt": lambda s, seed: _noisy(s, (60, 60, 62), 22, seed, gray=True),
    "street": _street,
    "concrete tiles": lambda s, seed: _grid_lines(_flat(s, (172, 170, 164)), 16, (120, 118, 112)),
    "glass facade": lambda s, seed: _grid_lines(_gradient(s, (60, 95, 140), (120, 160, 200), vertical=True),
                                                10, (200, 210, 220)),
}


def render_scene(scene: Scene, image_size: int = 64) -> np.ndarray:
    """The scene as an (image_size, image_size, 3) uint8 RGB array."""
    canvas = BACKGROUND_RENDERERS[scene.background](image_size, scene.background_seed)
    for obj in scene.objects:
        _draw_object(canvas, obj)
    return canvas


def encode_png(image: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image, mode="RGB").save(buffer, format="PNG", compress_level=6)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------------
# Captions
# ---------------------------------------------------------------------------------------------
# Template choices are drawn from a per-family RNG whose draws never depend on scene content, so
# siblings use the same templates and their captions differ only in the edited words.

NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
TEXTURE_PHRASES = {"solid": "a plain solid fill", "striped": "a striped pattern",
                   "dotted": "a dotted pattern", "checkered": "a checkered pattern"}
TEXTURE_DETAILS = {"solid": "a uniform fill", "striped": "thin horizontal stripes",
                   "dotted": "a grid of tiny dots", "checkered": "a fine checkerboard"}
SIZE_EXTENTS = {"small": "half a region wide", "medium": "two thirds of a region",
                "large": "filling its region"}


def _words(text: str) -> int:
    return len(text.split())


def _fix_articles(text: str) -> str:
    """'a orange' -> 'an orange' (no vocabulary word after 'a' starts with a 'u' sound)."""
    return re.sub(r"\b([Aa]) (?=[aeio])", r"\1n ", text)


def _capitalize(sentence: str) -> str:
    return sentence[:1].upper() + sentence[1:]


def _slots(obj: SceneObject) -> dict[str, str]:
    return {"size": obj.size, "color": obj.color, "shape": obj.shape, "texture": obj.texture,
            "texture_phrase": TEXTURE_PHRASES[obj.texture], "pos": CELLS[obj.cell]}


def _relation(a: SceneObject, b: SceneObject, terse: bool = False) -> str:
    """Where a is relative to b, from their grid cells."""
    (ra, ca), (rb, cb) = divmod(a.cell, 3), divmod(b.cell, 3)
    vertical = "above" if ra < rb else "below" if ra > rb else ""
    horizontal = "left" if ca < cb else "right" if ca > cb else ""
    side = "" if not horizontal else (f"{horizontal} of" if terse else f"to the {horizontal} of")
    if vertical and side:
        return f"{vertical} and {side}"
    return side or vertical


def _pick(templates: tuple[str, ...], rng: np.random.Generator) -> str:
    return templates[int(rng.integers(len(templates)))]


def _relation_sentences(objects: tuple[SceneObject, ...], templates: tuple[str, ...],
                        rng: np.random.Generator, terse: bool = False) -> list[str]:
    """One relation sentence per pair of objects, pairs in a seeded order."""
    pairs = [(i, j) for i in range(len(objects)) for j in range(i + 1, len(objects))]
    order = rng.permutation(len(pairs))
    sentences = []
    for k in order:
        i, j = pairs[k]
        if rng.integers(2):  # which object of the pair is the subject
            i, j = j, i
        a, b = objects[i], objects[j]
        sentences.append(_capitalize(_pick(templates, rng).format(
            a=f"{a.color} {a.shape}", b=f"{b.color} {b.shape}", rel=_relation(a, b, terse))))
    return sentences


def _fit(core: list[str], extras: list[str], planned: int, word_range: tuple[int, int]) -> str:
    """Join core sentences plus up to `planned` extras (more while below the minimum length),
    never letting an extra push the caption past the maximum."""
    sentences, count = list(core), sum(map(_words, core))
    for index, extra in enumerate(extras):
        if index >= planned and count >= word_range[0]:
            break
        if count + _words(extra) > word_range[1]:
            break
        sentences.append(extra)
        count += _words(extra)
    return " ".join(sentences)


# Style "A": terse pretraining captions.
TERSE_OPENINGS = ("{n} shapes on a {bg} background.", "A {bg} backdrop with {n} shapes.",
                  "Scene with {n} objects over {bg}.")
TERSE_OBJECTS = ("A {size} {color} {shape} with {texture} fill in the {pos} cell.",
                 "{pos} cell: {size} {texture} {color} {shape}, nothing else there.",
                 "One {color} {shape}, {size} and {texture}, placed at {pos}.")
TERSE_RELATIONS = ("{a} {rel} {b}.", "The {a} sits {rel} the {b}.")


def _caption_terse(scene: Scene, spec: VariantSpec, rng: np.random.Generator) -> str:
    opening = _pick(TERSE_OPENINGS, rng).format(n=NUMBER_WORDS[len(scene.objects)], bg=scene.background)
    body = [_pick(TERSE_OBJECTS, rng).format(**_slots(o)) for o in scene.objects]
    relations = _relation_sentences(scene.objects, TERSE_RELATIONS, rng, terse=True)
    return _fit([_capitalize(s) for s in [opening] + body], relations, int(rng.integers(1, 3)), spec.word_range)


# Style "B": long flowing DOCCI-like descriptions (also Urban-1K).
FLOWING_OPENINGS = (
    "The image shows {n} distinct objects arranged on a {bg} background.",
    "This picture contains {n} shapes set against a {bg} background.",
    "Against a {bg} background, {n} objects are scattered across a three by three layout.",
)
FLOWING_OBJECTS = (
    "In the {pos} there is a {size} {color} {shape} with {texture_phrase}.",
    "A {size} {shape} colored {color} sits in the {pos}, covered with {texture_phrase}.",
    "The {pos} area holds a {color} {shape} of {size} size with a {texture} texture.",
    "There is a {size}, {texture} {color} {shape} located in the {pos} part of the scene.",
)
FLOWING_RELATIONS = ("The {a} is {rel} the {b}.", "Relative to the {b}, the {a} is positioned {rel} it.",
                     "Looking at the layout, the {a} appears {rel} the {b}.")


def _caption_flowing(scene: Scene, spec: VariantSpec, rng: np.random.Generator) -> str:
    opening = _pick(FLOWING_OPENINGS, rng).format(n=NUMBER_WORDS[len(scene.objects)], bg=scene.background)
    body = [_pick(FLOWING_OBJECTS, rng).format(**_slots(o)) for o in scene.objects]
    relations = _relation_sentences(scene.objects, FLOWING_RELATIONS, rng)
    return _fit([opening] + [_capitalize(s) for s in body], relations, int(rng.integers(2, 5)), spec.word_range)


# Style "C": DCI-like region-by-region descriptions, in reading order like mask-aligned captions.
REGION_OPENINGS = ("A {bg} background fills the whole frame behind {n} separate objects.",
                   "The scene is a {bg} background divided into nine regions, {n} of them occupied.")
REGION_OBJECTS = (
    "The {pos} region contains a {color} {shape}. It is {size} and drawn with {texture_phrase}.",
    "Looking at the {pos}, we find a {size} {shape} in {color}, filled with {texture_phrase}.",
    "In the {pos} region: one {texture} {color} {shape} of {size} size.",
)
REGION_RELATIONS = ("The {a} region lies {rel} the {b}.", "Seen together, the {a} is {rel} the {b}.")


def _in_reading_order(scene: Scene) -> tuple[SceneObject, ...]:
    return tuple(sorted(scene.objects, key=lambda o: o.cell))


def _empty_regions_sentence(scene: Scene) -> str:
    occupied = {o.cell for o in scene.objects}
    empty = [CELLS[c] for c in range(len(CELLS)) if c not in occupied]
    listed = ", ".join(empty[:-1]) + (" and " if len(empty) > 1 else "") + empty[-1]
    return f"The {listed} {'regions show' if len(empty) > 1 else 'region shows'} only the background."


def _caption_regions(scene: Scene, spec: VariantSpec, rng: np.random.Generator) -> str:
    objects = _in_reading_order(scene)
    opening = _pick(REGION_OPENINGS, rng).format(n=NUMBER_WORDS[len(objects)], bg=scene.background)
    body = [_capitalize(_pick(REGION_OBJECTS, rng).format(**_slots(o))) for o in objects]
    relations = _relation_sentences(objects, REGION_RELATIONS, rng)
    core = [opening] + body + [_empty_regions_sentence(scene)]
    return _fit(core, relations, int(rng.integers(1, 4)), spec.word_range)


SHORT_TEMPLATES = ("{n} shapes on a {bg} background, including a {size} {color} {shape}.",
                   "A {bg} scene with {n} shapes, the largest a {color} {shape}.")


def _short_caption(scene: Scene, rng: np.random.Generator) -> str:
    """One-sentence summary naming the most salient (largest, then first in reading order) object."""
    ranks = list(SIZES)
    salient = max(_in_reading_order(scene), key=lambda o: ranks.index(o.size))  # max keeps the first of ties
    return _capitalize(_pick(SHORT_TEMPLATES, rng).format(
        n=NUMBER_WORDS[len(scene.objects)], bg=scene.background, **_slots(salient)))


def _fine_details(scene: Scene, max_relations: int = 2) -> str:
    """Long-DCI's extra paragraph: exact sizes and textures restated, plus pairwise layout."""
    objects = _in_reading_order(scene)
    sentences = [_capitalize(f"{o.color} {o.shape}: {SIZE_EXTENTS[o.size]}, {TEXTURE_DETAILS[o.texture]}.")
                 for o in objects]
    pairs = [(a, b) for i, a in enumerate(objects) for b in objects[i + 1:]][:max_relations]
    sentences += [f"The {a.color} {a.shape} is {_relation(a, b)} the {b.color} {b.shape}." for a, b in pairs]
    return "Fine details: " + " ".join(sentences)


# Style "D": Visual-Genome-like paragraphs, short simple sentences.
PARAGRAPH_OPENINGS = ("The background is {bg}.", "This is a {bg} picture.", "There are {n} shapes here.")
PARAGRAPH_OBJECTS = ("A {color} {shape} is at the {pos}. The {shape} is {size} and {texture}.",
                     "There is a {size} {color} {shape} at the {pos}. It looks {texture}.",
                     "At the {pos} is a {texture} {shape}. It is {color} and {size}.")
PARAGRAPH_RELATIONS = ("The {a} is {rel} the {b}.",)


def _caption_paragraph(scene: Scene, spec: VariantSpec, rng: np.random.Generator) -> str:
    opening = _pick(PARAGRAPH_OPENINGS, rng).format(n=NUMBER_WORDS[len(scene.objects)], bg=scene.background)
    body = [_pick(PARAGRAPH_OBJECTS, rng).format(**_slots(o)) for o in scene.objects]
    relations = _relation_sentences(scene.objects, PARAGRAPH_RELATIONS, rng)
    return _fit([opening] + body, relations, int(rng.integers(0, 3)), spec.word_range)


# Style "simple": one fixed sentence per object, no relations and no varied wording. The regime
# choice of the embedded default (docs/profiles.md, "The settings tried for the miniature"): with one
# grammar shared by the pretraining corpus and the benchmarks, the tiny backbone reaches a strong
# zero-shot init in minutes.
SIMPLE_OPENING = "{n} shapes on a {bg} background."
SIMPLE_OBJECT = "A {size} {color} {shape} with {texture_phrase} in the {pos}."


def _caption_simple(scene: Scene, spec: VariantSpec, rng: np.random.Generator) -> str:
    sentences = [SIMPLE_OPENING.format(n=NUMBER_WORDS[len(scene.objects)], bg=scene.background)]
    sentences += [SIMPLE_OBJECT.format(**_slots(obj)) for obj in scene.objects]
    return " ".join(_capitalize(s) for s in sentences)


CAPTION_STYLES = {"terse": _caption_terse, "flowing": _caption_flowing,
                  "regions": _caption_regions, "paragraph": _caption_paragraph, "simple": _caption_simple}
if tuple(CAPTION_STYLES) != CAPTION_STYLE_NAMES:  # params.yaml is validated against the spec's names
    raise ImportError(f"caption styles {tuple(CAPTION_STYLES)} differ from the spec's {CAPTION_STYLE_NAMES}")


def _captions(scene: Scene, spec: VariantSpec, caption_seed: np.random.SeedSequence,
              long_form: bool) -> tuple[str, str | None]:
    """(caption, short caption) of one scene; a fresh RNG from the family's caption seed each time."""
    rng = np.random.default_rng(caption_seed)
    caption = CAPTION_STYLES[spec.style](scene, spec, rng)
    short = _short_caption(scene, rng) if spec.short_captions else None
    if long_form:
        caption = f"{short}\n{caption} {_fine_details(scene)}"
    return _fix_articles(caption), short and _fix_articles(short)


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------

def _spread_families(families: list[int], rng: np.random.Generator) -> list[int]:
    """A seeded shuffle of row indices, repaired so that no two adjacent rows share a family."""
    n = len(families)
    order = [int(i) for i in rng.permutation(n)]

    def family_at(k: int) -> int:
        return families[order[k]]

    def clashes(k: int) -> bool:
        return (k > 0 and family_at(k) == family_at(k - 1)) or (k + 1 < n and family_at(k) == family_at(k + 1))

    for i in range(1, n):
        if family_at(i) != family_at(i - 1):
            continue
        # Swap in a later row (any clash this creates further on is repaired as the scan goes on),
        # else an earlier one that fits both ways. Tiny splits may have no fix; they keep the clash.
        for j in [*range(i + 1, n), *range(i - 1)]:
            order[i], order[j] = order[j], order[i]
            if family_at(i) != family_at(i - 1) and (j > i or not clashes(j)):
                break
            order[i], order[j] = order[j], order[i]
    return order


def generate_split(variant: str, split: str, n_images: int, seed: int, image_size: int = 64,
                   generator: dict | None = None) -> list[Sample]:
    """The first `n_images` rows of a split, in manifest (shuffled) order."""
    spec = check_variant_split(variant, split, generator)
    if n_images < 1:
        raise ValueError(f"n_images must be positive, got {n_images}")
    if image_size < 24:
        raise ValueError(f"image_size must be at least 24 px, got {image_size}")
    rows, shuffle_seed = _split_rows(spec, variant, split, n_images, seed)
    samples = [Sample(**row, split=split, image=render_scene(row["scene"], image_size)) for row in rows]
    order = _spread_families([s.family for s in samples], np.random.default_rng(shuffle_seed))
    return [samples[i] for i in order]


def _split_rows(spec: VariantSpec, variant: str, split: str, n_images: int,
                seed: int) -> tuple[list[dict], np.random.SeedSequence]:
    """(the split's first `n_images` rows in generation order, without images; the split's shuffle seed)."""
    long_form = split == spec.long_split
    scene_split = "test" if long_form else split  # Long-DCI re-describes the test scenes
    scene_seeds, shuffle_seed = _split_seeds(seed, variant, scene_split)
    n_families = -(-n_images // spec.family_size)
    rows: list[dict] = []
    for family, family_seed in enumerate(scene_seeds.spawn(n_families)):
        scene_seq, caption_seq = family_seed.spawn(2)
        for member, (edit, scene) in enumerate(_family_scenes(spec, np.random.default_rng(scene_seq))):
            if len(rows) == n_images:
                break
            caption, short = _captions(scene, spec, caption_seq, long_form)
            rows.append({"id": f"{variant}-{scene_split}-f{family:05d}-m{member}", "family": family, "member": member,
                         "edit": edit, "scene": scene, "caption": caption, "short_caption": short})
    return rows, shuffle_seed


def split_edits(variant: str, split: str, n_images: int, seed: int,
                generator: dict | None = None) -> dict[str, tuple[str | None, str]]:
    """{row id: (edit, caption)} of a split as `generate_split` makes it, without rendering: the edit that made
    each sibling from its family's base scene (None for the base), for analyses by edit kind, and the caption,
    with which a reader checks that a manifest is this generator's output for these arguments."""
    spec = check_variant_split(variant, split, generator)
    rows, _ = _split_rows(spec, variant, split, n_images, seed)
    return {row["id"]: (row["edit"], row["caption"]) for row in rows}


# ---------------------------------------------------------------------------------------------
# Writing datasets
# ---------------------------------------------------------------------------------------------

def _replace_dir(built: Path, target: Path) -> None:
    """Move a finished directory onto `target`, replacing any previous one."""
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
        os.replace(target, old / target.name)
        os.replace(built, target)
        shutil.rmtree(old)
    else:
        os.replace(built, target)


def write_dataset(out_dir: str | Path, variant: str, sizes: dict[str, int], seed: int,
                  image_size: int = 64, generator: dict | None = None) -> dict[str, Path]:
    """Write out_dir/images/<id>.png and out_dir/<split>.jsonl for each split; returns {split: manifest}.

    For dci, requesting "test" also writes "test_long" (Long-DCI: the same images with full-length
    captions). `generator` overrides the variant's caption style and family size. The directory is
    built next to out_dir and renamed into place, so readers never see a half-written dataset;
    rerunning replaces it.
    """
    spec = check_sizes(variant, sizes, generator)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".part", dir=out_dir.parent))
    try:
        (building / "images").mkdir()
        for split, n in splits_to_write(spec, sizes).items():
            rows = []
            for sample in generate_split(variant, split, n, seed, image_size, generator):
                image_path = building / "images" / f"{sample.id}.png"
                png = encode_png(sample.image)
                if not image_path.exists():  # test_long shares the test images
                    image_path.write_bytes(png)
                rows.append(ManifestRow(id=sample.id, image=f"images/{sample.id}.png", caption=sample.caption,
                                        short_caption=sample.short_caption, split=split,
                                        source_sha256=sha256_bytes(png)))
            write_manifest(building / f"{split}.jsonl", rows)
        _replace_dir(building, out_dir)
    finally:
        if building.exists():
            shutil.rmtree(building)
    return {split: out_dir / f"{split}.jsonl" for split in splits_to_write(spec, sizes)}
