"""Training batches of the baselines that read auxiliary inputs: GOAL (its LISM segment pair per
image) and StructXLIP (edge maps, edge crops of the top segments, the filtered caption and its
chunks). Each sample's tensors are built once and cached, like `PairDataset`'s images."""
from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image

from hnclip.auxiliary.caption_filter import filter_caption, structure_chunk_spans
from hnclip.auxiliary.lism import segment_or_fallback
from hnclip.auxiliary.segments import crop_of
from hnclip.config.constants import CONTEXT_LENGTH
from hnclip.data.loader import PairDataset
from hnclip.io import read_jsonl
from hnclip.losses.goal import GoalBatch, GoalSettings, box_to_patch_indices, patch_mask, sentence_token_span
from hnclip.losses.structxlip import StructXBatch


def _rows_by_id(path: Path, dataset: PairDataset) -> list[dict]:
    """The auxiliary file's rows in the dataset's order; every training image must have one."""
    rows = {row["id"]: row for row in read_jsonl(path)}
    missing = [r.id for r in dataset.rows if r.id not in rows]
    if missing:
        raise ValueError(f"{path} has no row for {len(missing)} training image(s) (e.g. {missing[:3]}); "
                         f"rebuild it (its rule reruns when the training manifest changes)")
    return [rows[r.id] for r in dataset.rows]


def _image(path: Path, preprocess, mode: str = "RGB") -> torch.Tensor:
    with Image.open(path) as img:
        return preprocess(img.convert(mode).convert("RGB"))


def _box_crop(path: Path, bbox: dict, preprocess) -> torch.Tensor:
    """The segment crop: the RGB image cut to the box, the pixels a crop PNG of it holds (lossless)."""
    with Image.open(path) as img:
        return preprocess(crop_of(img, bbox))


class GoalInputs:
    """GOAL micro-batches: each image with its max-similarity segment crop and matched sentence,
    the segment's tokens on the ViT grid and the sentence's token span in the caption. An image
    without a segment trains on itself: full image, full caption, every patch (counted in
    `fallbacks`)."""

    def __init__(self, dataset: PairDataset, segments_jsonl: str | Path, tokenizer, grid_image_size: int,
                 patch_size: int, settings: GoalSettings):
        self.dataset, self.tokenizer, self.settings = dataset, tokenizer, settings
        self.path = Path(segments_jsonl)
        self.rows = _rows_by_id(self.path, dataset)
        self.grid_image_size, self.patch_size = grid_image_size, patch_size
        self.num_tokens = (grid_image_size // patch_size) ** 2 + 1
        self._cache: dict[int, tuple] = {}
        self.fallbacks = sum(row["segment"] is None for row in self.rows)

    def _sample(self, index: int) -> tuple:
        if index in self._cache:
            return self._cache[index]
        row, caption = self.rows[index], self.dataset.rows[index].caption
        pair = segment_or_fallback(row)
        if pair["fallback"]:
            image, sentence = self.dataset.image(index), caption
            mask = torch.ones(self.num_tokens, dtype=torch.bool)
            length = min(len(self.tokenizer.encode(caption)), CONTEXT_LENGTH - 2)
            span = (1, max(1, length))
        elif "crop_file" in pair:   # rows made with crop files (LismSettings.crop_files)
            image = _image(self.path.parent / pair["crop_file"], self.dataset.preprocess)
        else:
            image = _box_crop(self.dataset.rows[index].image, pair["bbox"], self.dataset.preprocess)
        if not pair["fallback"]:
            sentence = pair["sentence"]
            indices = box_to_patch_indices(pair["bbox"], tuple(pair["image_size"]), self.grid_image_size,
                                           self.patch_size, patch_size_bug=self.settings.patch_size_bug,
                                           box_scale=self.settings.box_scale)
            mask = patch_mask([indices], self.num_tokens)[0]
            span = sentence_token_span(caption, pair["sentence_index"], self.tokenizer.encode, CONTEXT_LENGTH,
                                       late_by_one=self.settings.late_by_one)
        sample = (image, self.tokenizer([sentence])[0], mask, torch.tensor(span, dtype=torch.long))
        self._cache[index] = sample
        return sample

    def batch(self, indices) -> GoalBatch:
        images, tokens = self.dataset.batch(indices)
        samples = [self._sample(i) for i in indices]
        return GoalBatch(images, tokens, *(torch.stack(parts) for parts in zip(*samples, strict=True)))


class StructXInputs:
    """StructXLIP micro-batches: the global edge map, the edge crops of the top-K segments (padded
    with invalid blanks), the lexicon-filtered caption and its chunk spans."""

    def __init__(self, dataset: PairDataset, edges_jsonl: str | Path, tokenizer, settings: dict):
        self.dataset, self.tokenizer, self.settings = dataset, tokenizer, settings
        self.path = Path(edges_jsonl)
        self.rows = _rows_by_id(self.path, dataset)
        self.top_k = settings["top_k"]
        self._cache: dict[int, tuple] = {}

    def _sample(self, index: int) -> tuple:
        if index in self._cache:
            return self._cache[index]
        row, preprocess = self.rows[index], self.dataset.preprocess
        filtered = filter_caption(self.dataset.rows[index].caption, tuple(self.settings["lexicons"]))
        edge = _image(self.path.parent / row["edge_file"], preprocess, "L")
        crops = [_image(self.path.parent / c["edge_crop_file"], preprocess, "L") for c in row["crops"][:self.top_k]]
        valid = [True] * len(crops) + [False] * (self.top_k - len(crops))
        crops += [torch.zeros_like(edge)] * (self.top_k - len(crops))
        sample = (self.tokenizer([filtered])[0], edge, torch.stack(crops), torch.tensor(valid),
                  structure_chunk_spans(filtered, self.tokenizer))
        self._cache[index] = sample
        return sample

    def batch(self, indices) -> StructXBatch:
        images, tokens = self.dataset.batch(indices)
        filtered, edges, crops, valid, spans = zip(*(self._sample(i) for i in indices), strict=True)
        return StructXBatch(images=images, tokens=tokens, filtered_tokens=torch.stack(filtered),
                            edge_images=torch.stack(edges), has_edge=torch.ones(len(indices), dtype=torch.bool),
                            edge_crops=torch.stack(crops), crop_valid=torch.stack(valid), chunk_spans=list(spans))
