"""GOAL's LISM pairs: each caption sentence matched to the image segment a CLIP model finds closest.

Per image (GOAL LISM/make_pseudo_local_pair_for_trainset.py, re-implemented):
  sentences  = caption.split('.'), stripped, empties dropped;
  candidates = [full image] + crops of the segments kept by the area filter (`segments_of`);
  every (sentence, candidate) pair is scored by cosine similarity of the matcher's features, and
  each sentence goes to its argmax candidate (first on ties). The release stores
  logits_per_image = 100*cos; we store the cosine (same ranking).

Explicit choices where the release is silent or unreleased:
  - del_org (`drop_full_image`, default on): sentences matched to the full image are dropped, as the
    unreleased merge step that wrote GOAL's "..._sim_max_del_org.json" did.
  - `long_sentence`: a sentence longer than the matcher's context makes the released CLIP call
    raise, and the whole image is skipped ("skip_image", default, as released). "truncate" keeps
    the image and lets the encoder truncate. Contexts: openai/clip-vit-large-patch14-336 has 77
    tokens; the embedded profile's tiny backbone has 248, so there the rule practically never fires.
  - GOAL trains on ONE pair per image, the same every epoch: the max-similarity match (`segment`).
    The full ranked list (`matches`) is kept too, for StructXLIP's top-K edge crops.
  - Images left without a segment (no mask passes the area filter, every sentence matched the full
    image, or skipped) get `segment: null` and a `no_segment` reason. GOAL's loader reads
    `segment[0]` of every entry, so its training JSON can only list images with a segment: such
    images drop out of GOAL's training set. `segment_or_fallback` offers the alternative we propose:
    train on the full image and full caption in the segment slot, flagged `fallback: true`.

Output: `segments.jsonl`, one row per manifest image. A match names its crop by `crop_id`
(`<image stem>_seg<mask index>`, or `_full`) and its `bbox` in the original image: the crop is the
image cut to that box, made where it is read (`hnclip.auxiliary.batches`). GOAL's release cuts the
same box (make_pseudo_local_pair_for_trainset.py: `np.array(image)[y_min:y_max+1, x_min:x_max+1]`
of the RGB image, background kept) and saves it as a PNG, which is lossless: the same pixels.
`LismSettings.crop_files` writes those PNGs under `crops/` as before instead (rows then name
`crop_file`, relative to the directory of `segments.jsonl`, in place of `crop_id`); a rebuild
rewrites them, and crops of an earlier run with other settings stay behind unless out_dir is cleared.
`sentence_index` indexes `sentences(caption)` (GOAL's text-span loss re-finds the sentence in the
caption by its text).

Speed: a segmenter with a `segments(image, min_area, max_area)` method (`DirectSamSegmenter`) gives
the kept segments' boxes without full-size masks on the host, and a matcher with `encode_boxes`
(`hf_clip_encoders`) cuts and preprocesses the crops as tensors on its device; the next batch's
images are decoded in a thread while the current one is on the device.

Extraction is sharded and resumable (`hnclip.auxiliary.shards`): every `shard_images` images
their rows go to `segments.jsonl.shards/shard-NNNNN.jsonl`, and a restarted job (the same manifest,
segmenter, matcher, settings and batch size) skips the finished shards; `segments.jsonl` is
assembled from them at the end, byte-identical to an uninterrupted run's.
"""
from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from hnclip.auxiliary.segments import Segment, Segmenter, crop_of, segmenter_fingerprint, segments_of
from hnclip.auxiliary.shards import DEFAULT_SHARD_ITEMS, build_sharded
from hnclip.data.manifest import read_manifest
from hnclip.hashing import file_sha256
from hnclip.io import atomic_path

LONG_SENTENCE_MODES = ("skip_image", "truncate")


@dataclass(frozen=True)
class Encoders:
    """A CLIP-style matcher: L2-normalised features of images and texts, and its text context."""
    encode_images: Callable[[list[Image.Image]], np.ndarray]   # N images -> [N, D]
    encode_texts: Callable[[list[str]], np.ndarray]            # M texts -> [M, D]; truncates to the context
    count_tokens: Callable[[str], int]                         # tokens incl. start/end markers
    context_length: int
    name: str
    # optional: features of images cut to boxes, [(image, [bbox, ...]), ...] -> [sum of boxes, D], equal
    # within float tolerance to encode_images of the PIL crops (their preprocessing as tensor ops on the device)
    encode_boxes: Callable[[list[tuple[Image.Image, list[dict]]]], np.ndarray] | None = None
    fingerprint: dict = field(default_factory=dict)   # what names the weights beyond `name` (files' sha256)


@dataclass(frozen=True)
class LismSettings:
    min_area: float = 0.01
    max_area: float = 0.80
    drop_full_image: bool = True        # del_org
    long_sentence: str = "skip_image"   # or "truncate"
    crop_files: bool = False            # write each matched crop as a PNG (as the release) instead of a box only

    def __post_init__(self) -> None:
        if self.long_sentence not in LONG_SENTENCE_MODES:
            raise ValueError(f"long_sentence must be one of {LONG_SENTENCE_MODES}, got {self.long_sentence!r}")
        if not 0.0 <= self.min_area <= self.max_area <= 1.0:
            raise ValueError(f"need 0 <= min_area <= max_area <= 1, got {self.min_area}, {self.max_area}")


@dataclass(frozen=True)
class Match:
    sentence_index: int
    candidate: int      # 0 = the full image, k >= 1 = the k-th kept segment
    similarity: float   # cosine


def sentences(caption: str) -> list[str]:
    """The release's sentence split: on '.', stripped, empties dropped."""
    return [part.strip() for part in caption.split(".") if part.strip()]


def match_sentences(text_features: np.ndarray, candidate_features: np.ndarray) -> list[Match]:
    """Each sentence's argmax candidate by cosine similarity (first index on ties)."""
    texts = _unit_rows(text_features)
    candidates = _unit_rows(candidate_features)
    similarity = texts @ candidates.T
    best = similarity.argmax(axis=1)
    return [Match(j, int(best[j]), float(similarity[j, best[j]])) for j in range(len(texts))]


def _unit_rows(features) -> np.ndarray:
    array = np.asarray(features, dtype=np.float64)
    return array / np.linalg.norm(array, axis=1, keepdims=True)


def ranked_matches(matches: list[Match], drop_full_image: bool) -> list[Match]:
    """Matches by decreasing similarity (sentence order on ties), without full-image ones if del_org."""
    kept = [m for m in matches if not (drop_full_image and m.candidate == 0)]
    return sorted(kept, key=lambda m: -m.similarity)


def file_stem(image_id: str) -> str:
    """A filesystem-safe stem; ids that needed changes get a hash suffix so stems stay distinct."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", image_id)
    if safe == image_id:
        return safe
    return f"{safe}-{hashlib.sha256(image_id.encode('utf-8')).hexdigest()[:8]}"


def _write_png(image: Image.Image, path: Path) -> None:
    with atomic_path(path) as tmp:
        image.save(tmp, format="PNG")


@dataclass(frozen=True)
class LismImage:
    """One image to pair: RGB pixels, caption, segments kept by the area filter, raw mask count."""
    id: str
    caption: str
    image: Image.Image
    segments: list[Segment]
    n_masks: int


def _skip_reason(item: LismImage, texts: list[str], encoders: Encoders, settings: LismSettings) -> str | None:
    if not texts:
        return "no_sentences"
    if settings.long_sentence == "skip_image" and any(encoders.count_tokens(t) > encoders.context_length
                                                      for t in texts):
        return "long_sentence"
    if not item.segments and settings.drop_full_image:  # every sentence could only match the full image
        return "no_segments"
    return None


def lism_rows(images: list[LismImage], encoders: Encoders, settings: LismSettings, out_dir: Path) -> list[dict]:
    """The segments.jsonl rows of a batch of images; with `settings.crop_files`, writes the crops of
    their matched candidates.

    The matcher is called once for all sentences and once for all candidates of the batch.
    """
    rows, pending = [], []
    for item in images:
        texts = sentences(item.caption)
        reason = _skip_reason(item, texts, encoders, settings)
        rows.append({"id": item.id, "caption": item.caption, "image_size": [item.image.width, item.image.height],
                     "n_masks": item.n_masks, "n_segments": len(item.segments), "n_sentences": len(texts),
                     "segment": None, "matches": [], "no_segment": reason})
        if reason is None:
            pending.append((len(rows) - 1, item, texts))
    if not pending:
        return rows
    text_features = encoders.encode_texts([t for _, _, texts in pending for t in texts])
    if encoders.encode_boxes is not None and not settings.crop_files:
        image_features = encoders.encode_boxes([(item.image, [_full_box(item.image)] + [s.bbox for s in item.segments])
                                                for _, item, _ in pending])
    else:
        image_features = encoders.encode_images([c for _, item, _ in pending for c in [item.image] + [
            s.crop if s.crop is not None else crop_of(item.image, s.bbox) for s in item.segments]])
    t0 = c0 = 0
    for index, item, texts in pending:
        t1, c1 = t0 + len(texts), c0 + 1 + len(item.segments)
        ranked = ranked_matches(match_sentences(text_features[t0:t1], image_features[c0:c1]), settings.drop_full_image)
        rows[index] = _paired_row(rows[index], item, texts, ranked, out_dir, settings.crop_files)
        t0, c0 = t1, c1
    return rows


def _full_box(image: Image.Image) -> dict[str, int]:
    width, height = image.size
    return {"x1": 0, "y1": 0, "x2": width, "y2": height, "width": width, "height": height}


def crop_name(entry: dict) -> str:
    """The name of a match's crop: its `crop_id`, or the stem of its `crop_file` (rows with crop files)."""
    return entry["crop_id"] if "crop_id" in entry else Path(entry["crop_file"]).stem


def _paired_row(row: dict, item: LismImage, texts: list[str], ranked: list[Match], out_dir: Path,
                crop_files: bool) -> dict:
    if not ranked:
        return {**row, "no_segment": "all_matched_full_image"}
    width, height = item.image.size
    full_box = _full_box(item.image)
    stem = file_stem(item.id)
    written: dict[int, str] = {}
    entries = []
    for m in ranked:
        segment = item.segments[m.candidate - 1] if m.candidate else None
        if m.candidate not in written:
            name = f"{stem}_{f'seg{segment.mask_index}' if segment else 'full'}"
            if crop_files:
                crop = (segment.crop if segment.crop is not None else crop_of(item.image, segment.bbox)) \
                    if segment else item.image
                _write_png(crop, out_dir / f"crops/{name}.png")
            written[m.candidate] = name
        reference = {"crop_file": f"crops/{written[m.candidate]}.png"} if crop_files else {
            "crop_id": written[m.candidate]}
        entries.append({**reference, "sentence": texts[m.sentence_index],
                        "sentence_index": m.sentence_index, "similarity": m.similarity,
                        "bbox": segment.bbox if segment else full_box,
                        "mask_index": segment.mask_index if segment else None, "image_size": [width, height]})
    return {**row, "segment": entries[0], "matches": entries}


def segment_or_fallback(row: dict) -> dict:
    """The training pair of a segments.jsonl row: its segment, or (proposed fallback for images
    without one) the full image with the full caption, flagged `fallback: true`."""
    if row["segment"] is not None:
        return {**row["segment"], "fallback": False}
    width, height = row["image_size"]
    return {"crop_id": None, "sentence": row["caption"], "sentence_index": None, "similarity": None,
            "bbox": {"x1": 0, "y1": 0, "x2": width, "y2": height, "width": width, "height": height},
            "mask_index": None, "image_size": [width, height], "fallback": True}


class _Prefetcher:
    """Decodes the images that follow each asked-for batch in a thread, while the device works."""

    def __init__(self, items: Sequence, ahead: int):
        self.position = {id(item): k for k, item in enumerate(items)}
        self.items, self.ahead = items, ahead
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="decode")
        self.pending: dict[int, Future] = {}

    def images(self, batch: Sequence) -> list[Image.Image]:
        last = self.position[id(batch[-1])]
        for k in range(last + 1, min(last + 1 + self.ahead, len(self.items))):
            self._submit(k)
        return [self._take(item) for item in batch]

    def _submit(self, k: int) -> None:
        if k not in self.pending:
            self.pending[k] = self.pool.submit(decode_rgb, self.items[k].image)

    def _take(self, item) -> Image.Image:
        k = self.position[id(item)]
        self._submit(k)
        return self.pending.pop(k).result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def decode_rgb(path: str | Path) -> Image.Image:
    with Image.open(path) as opened:
        return opened.convert("RGB")


def image_segments(segmenter: Segmenter, image: Image.Image, settings: LismSettings) -> tuple[int, list[Segment]]:
    """(number of masks, the segments the area filter keeps) of an image."""
    if callable(getattr(segmenter, "segments", None)):
        return segmenter.segments(image, settings.min_area, settings.max_area)
    masks = segmenter.masks(image)
    return len(masks), segments_of(image, masks, settings.min_area, settings.max_area)


def build_lism(manifest_path: str | Path, out_dir: str | Path, segmenter: Segmenter, encoders: Encoders,
               settings: LismSettings = LismSettings(), batch_images: int = 32, *,
               shard_images: int = DEFAULT_SHARD_ITEMS, fingerprint: dict | None = None,
               only_shard: int | None = None, gather: bool = False) -> dict:
    """Segment and match every image of a manifest; writes out_dir/segments.jsonl (and out_dir/crops/
    with `settings.crop_files`).

    Images are matched `batch_images` at a time, in shards of `shard_images` (resumable, see the
    module docstring); `only_shard` makes one shard and nothing else, `gather` assembles
    segments.jsonl from the shards (`build_sharded`). `fingerprint` adds what names the models beyond
    the segmenter's and matcher's own fingerprints to what a shard must have been made from to be
    reused. Returns a summary: images, with_segment, no_segment counts by reason, mean segments kept by
    the area filter, mean matches, wall time (this run's), shards made and reused, matcher name and
    settings (of the shard's images only, with `only_shard`).
    """
    start = time.perf_counter()
    out_dir = Path(out_dir)
    items = read_manifest(manifest_path)
    identity = {"step": "lism", "manifest_sha256": file_sha256(manifest_path), "settings": asdict(settings),
                "matcher": encoders.name, "segmenter": segmenter_fingerprint(segmenter),
                "batch_images": batch_images, **(fingerprint or {})}
    if encoders.fingerprint:
        identity["matcher_files"] = encoders.fingerprint
    prefetch = _Prefetcher(items, batch_images)

    def make_rows(batch) -> list[dict]:
        images = []
        for item, image in zip(batch, prefetch.images(batch), strict=True):
            n_masks, segments = image_segments(segmenter, image, settings)
            images.append(LismImage(item.id, item.caption, image, segments, n_masks))
        return lism_rows(images, encoders, settings, out_dir)

    try:
        rows, shards = build_sharded(items, make_rows, out_dir / "segments.jsonl", identity, shard_items=shard_images,
                                     batch_items=batch_images, desc="segments", only_shard=only_shard, gather=gather,
                                     files_of=lambda row: [m["crop_file"] for m in row["matches"] if "crop_file" in m])
    finally:
        prefetch.close()
    return lism_summary(rows, shards, time.perf_counter() - start, encoders.name, settings)


def lism_summary(rows: list[dict], shards: dict, wall_s: float, matcher: str, settings: LismSettings) -> dict:
    reasons: dict[str, int] = {}
    for row in rows:
        if row["no_segment"]:
            reasons[row["no_segment"]] = reasons.get(row["no_segment"], 0) + 1
    return {"images": len(rows), "with_segment": sum(row["segment"] is not None for row in rows),
            "no_segment": reasons, "mean_segments_kept": float(np.mean([row["n_segments"] for row in rows])),
            "mean_matches": float(np.mean([len(row["matches"]) for row in rows])),
            "wall_s": wall_s, **shards, "matcher": matcher, "settings": asdict(settings)}


def hf_clip_encoders(model_path: str | Path, device: str = "cpu", batch_size: int = 64) -> Encoders:
    """A transformers CLIPModel + processor as matcher (paper profile: openai/clip-vit-large-patch14-336)."""
    import torch
    from transformers import CLIPModel, CLIPProcessor

    model = CLIPModel.from_pretrained(str(model_path)).to(device).eval()
    processor = CLIPProcessor.from_pretrained(str(model_path))
    context = int(model.config.text_config.max_position_embeddings)

    def features(output) -> torch.Tensor:
        # transformers 5 returns a model output whose pooler_output is the projected feature
        pooled = output if isinstance(output, torch.Tensor) else output.pooler_output
        return torch.nn.functional.normalize(pooled.float(), dim=-1)

    @torch.no_grad()
    def encode_images(images: list[Image.Image]) -> np.ndarray:
        chunks = []
        for i in range(0, len(images), batch_size):
            pixels = processor(images=images[i:i + batch_size], return_tensors="pt")["pixel_values"]
            chunks.append(features(model.get_image_features(pixel_values=pixels.to(device))).cpu())
        return torch.cat(chunks).numpy()

    @torch.no_grad()
    def encode_texts(texts: list[str]) -> np.ndarray:
        chunks = []
        for i in range(0, len(texts), batch_size):
            tokens = processor.tokenizer(texts[i:i + batch_size], padding=True, truncation=True,
                                         max_length=context, return_tensors="pt").to(device)
            chunks.append(features(model.get_text_features(**tokens)).cpu())
        return torch.cat(chunks).numpy()

    def count_tokens(text: str) -> int:
        return len(processor.tokenizer(text)["input_ids"])

    @torch.no_grad()
    def encode_boxes(images: list[tuple[Image.Image, list[dict]]]) -> np.ndarray:
        # The processor's own tensor path (transformers 5: a torchvision backend; PIL input is turned
        # into this same uint8 CHW tensor first), fed slices of one tensor per image on the device.
        crops = []
        for image, boxes in images:
            pixels = torch.from_numpy(np.array(image.convert("RGB"))).to(device).permute(2, 0, 1)
            crops += [pixels[:, b["y1"]:b["y2"], b["x1"]:b["x2"]] for b in boxes]
        chunks = []
        for i in range(0, len(crops), batch_size):
            values = processor.image_processor(images=crops[i:i + batch_size], return_tensors="pt", device=device,
                                               input_data_format="channels_first")["pixel_values"]
            chunks.append(features(model.get_image_features(pixel_values=values.to(device))).cpu())
        return torch.cat(chunks).numpy()

    from hnclip.auxiliary.segments import directory_sha256
    return Encoders(encode_images, encode_texts, count_tokens, context, f"hf-clip:{model_path}",
                    encode_boxes=encode_boxes, fingerprint={"files": directory_sha256(model_path)})


def backbone_encoders(backbone, device: str = "cpu", batch_size: int = 64) -> Encoders:
    """The pipeline's own open_clip backbone (`hnclip.models.factory.Backbone`) as matcher."""
    import torch

    from hnclip.models.towers import encode_image, encode_text

    model = backbone.model.to(device).eval()
    context = int(backbone.tokenizer.context_length)

    @torch.no_grad()
    def encode_images(images: list[Image.Image]) -> np.ndarray:
        chunks = []
        for i in range(0, len(images), batch_size):
            pixels = torch.stack([backbone.preprocess(im) for im in images[i:i + batch_size]])
            chunks.append(encode_image(model, pixels.to(device)).cpu())
        return torch.cat(chunks).numpy()

    @torch.no_grad()
    def encode_texts(texts: list[str]) -> np.ndarray:
        chunks = [encode_text(model, backbone.tokenizer(texts[i:i + batch_size]).to(device)).cpu()
                  for i in range(0, len(texts), batch_size)]
        return torch.cat(chunks).numpy()

    def count_tokens(text: str) -> int:
        return len(backbone.tokenizer.encode(text)) + 2  # + start and end of text

    return Encoders(encode_images, encode_texts, count_tokens, context, "backbone")
