"""The caption grammar of the procedural benchmarks: templated captions in each style (terse, flowing,
regions, paragraph, simple), the one-sentence short captions, and Long-DCI's fine-detail paragraph.

Template choices are drawn from a per-family RNG whose draws never depend on scene content, so
siblings use the same templates and their captions differ only in the edited words: near-duplicates,
like the hard negatives of real dense-caption benchmarks.
"""
from __future__ import annotations

import re

import numpy as np

from hnclip.config.synthetic_spec import CAPTION_STYLE_NAMES, CELLS, SIZES, VariantSpec
from hnclip.data.synthetic_scenes import Scene, SceneObject

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


def family_style(style, caption_seed: np.random.SeedSequence) -> str:
    """The style a family's captions are written in: the spec's, or one drawn from its mixture by the family's
    caption seed (every sibling of a family in the same grammar). A single style draws nothing, so its
    datasets are byte-identical to those written before mixtures existed."""
    if isinstance(style, str):
        return style
    names, shares = zip(*style)
    # generate_state does not advance the seed sequence, so the captions' own stream is unchanged
    draw = np.random.default_rng(caption_seed.generate_state(2)).random()
    return names[min(int(np.searchsorted(np.cumsum(shares), draw, side="right")), len(names) - 1)]


def scene_captions(scene: Scene, spec: VariantSpec, caption_seed: np.random.SeedSequence,
                   long_form: bool) -> tuple[str, str | None]:
    """(caption, short caption) of one scene; a fresh RNG from the family's caption seed each time."""
    rng = np.random.default_rng(caption_seed)
    caption = CAPTION_STYLES[family_style(spec.style, caption_seed)](scene, spec, rng)
    short = _short_caption(scene, rng) if spec.short_captions else None
    if long_form:
        caption = f"{short}\n{caption} {_fine_details(scene)}"
    return _fix_articles(caption), short and _fix_articles(short)
