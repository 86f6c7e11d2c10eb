"""Rendering a scene of the procedural benchmarks to pixels, and the PNG bytes written for it.

Drawn with numpy masks (no antialiasing), so the same scene always gives the same pixels; every
attribute a caption mentions (shape, colour, size, texture, grid cell, background) is visible.
"""
from __future__ import annotations

import functools
import io
import math
from typing import Callable

import numpy as np
from PIL import Image

from hnclip.config.synthetic_spec import COLORS, SIZES
from hnclip.data.synthetic_scenes import Scene, SceneObject


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
