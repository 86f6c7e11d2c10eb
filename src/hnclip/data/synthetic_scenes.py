"""Scenes of the procedural benchmarks, and the near-duplicate siblings of a family.

A scene is a few textured shapes in the cells of a 3x3 grid over a named background. A family is a
base scene plus siblings that differ from it in one edit (one object's colour, shape, texture or size,
or two objects swapping cells), like the hard negatives of real dense-caption benchmarks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from hnclip.config.synthetic_spec import (
    CELLS,
    COLORS,
    MAX_OFFSET,
    SHAPES,
    SIZES,
    TEXTURES,
    VariantSpec,
    edit_kinds_of,
    held_out_colors_of,
)


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


def scene_differences(a: Scene, b: Scene) -> list[tuple[int, str]]:
    """(object index, attribute) pairs where two scenes with the same object count differ."""
    if len(a.objects) != len(b.objects):
        raise ValueError("scenes have different object counts")
    diffs = [(-1, "background")] if a.background != b.background else []
    for index, (x, y) in enumerate(zip(a.objects, b.objects)):
        diffs += [(index, attr) for attr in ("shape", "color", "size", "texture", "cell")
                  if getattr(x, attr) != getattr(y, attr)]
    return diffs


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


def family_scenes(spec: VariantSpec, rng: np.random.Generator) -> list[tuple[str | None, Scene]]:
    """[(edit, scene)]: the base scene, then one sibling per distinct edit kind."""
    base = _sample_scene(spec, rng)
    kinds = rng.choice(edit_kinds_of(spec), size=spec.family_size - 1, replace=False)
    return [(None, base)] + [(str(k), _edit_scene(base, str(k), spec, rng)) for k in kinds]
