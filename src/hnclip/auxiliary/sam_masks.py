"""SAM automatic mask generation without the pipeline's per-mask overheads, same masks in the same order.

`DirectSamSegmenter` gives what transformers' "mask-generation" pipeline gives (crops_n_layers=0, the
released setting) for the installed transformers (5.x; read from
transformers/pipelines/mask_generation.py and models/sam/image_processing_sam.py):

  pipeline                                           here
  preprocess: generate_crop_boxes (32x32 grid),      the same calls, on the CPU as there
    the image processor (resize 1024, pad)
  image embedding once, prompts in batches of        the same; prompt batches halve on out-of-memory
    points_per_batch (multimask: 3 masks a prompt)     (each prompt's masks do not depend on its batch)
  post_process_masks: EVERY mask bilinear to         none upsampled to filter: for the masks with iou >
    1024, unpadded, bilinear to the image size         pred_iou_thresh, the pixel counts above +1, -1, 0 and
  filter_masks: iou > thresh, stability > thresh     the box of > 0 come from the low-res logits
    (logits > +-1), binarize > 0, boxes; masks         (`_threshold_statistics`: exact, see there), then the
    RLE-encoded                                        same int32 / int32 stability and thresholds; no RLE
  postprocess: batched_nms(boxes, iou, 0.7) on the   the same call on the same CPU tensors, same order;
    CPU; every kept mask RLE-decoded                   only `masks()` upsamples, and only NMS's survivors
  (crop box = the whole image, so the crop-edge filter and the padding are no-ops with 0 crop layers)

`segments(image, min_area, max_area)` then applies `segments_of`'s area filter and tight box (area = the
count above 0; the box is the NMS box, inclusive, + 1 on the right/bottom) and upsamples no mask. Images
SAM sees thumbnailed (> 4000 x 3000) take the release's NEAREST resize of each kept mask on the host, as
`SamSegmenter` does. Equality with the pipeline is tested on the rehearsal's tiny SAM, and the counts
and boxes against the upsampled masks' (tests/test_sam_segments.py).
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from hnclip.auxiliary.segments import Segment, mask_bbox, sam_fingerprint, sam_input
from hnclip.runtime.out_of_memory import is_out_of_memory, release_cached_memory

log = logging.getLogger(__name__)

NMS_IOU = 0.7           # the pipeline's crops_nms_thresh default
UPSAMPLE_BYTES = 1 << 30  # full-size float logits upsampled at a time (a chunk of masks)


class DirectSamSegmenter:
    """SamModel + its image processor, called directly; the pipeline's masks without its overheads.

    `dtype` "fp32" is the released setting (the pipeline's) and the default; "bf16" runs the model in
    bfloat16. Measured agreement on the rehearsal input (the paper_rehearsal profile's tiny SAM,
    `save_tiny_sam(image_size=SAM_IMAGE_SIZE, confident=True, seed=0)`, 24 synthetic DOCCI train scenes,
    seed 3): fp32 gave the pipeline's masks on all 24; bf16 the same number of masks (1 per image) but
    none identical, mean IoU 0.67 with fp32's. The tiny model's logits are scaled by 1e8, so this is a
    worst case, but untested on SAM ViT-H: keep fp32 for the paper run.
    `points_per_batch` is the first prompt batch tried; on out-of-memory it halves (kept for the rest
    of the process; `prompt_batch_fallbacks` counts). The released 128 gives the pipeline's masks bit
    for bit; a larger batch on a GPU may change the decoder's float rounding.
    """

    def __init__(self, model: str | Path, points_per_side: int = 32, pred_iou_thresh: float = 0.88,
                 stability_score_thresh: float = 0.95, points_per_batch: int = 128, device: str | None = None,
                 dtype: str = "fp32"):
        from transformers import AutoImageProcessor, SamModel  # heavy import, only when SAM is used

        if dtype not in ("fp32", "bf16"):
            raise ValueError(f"dtype must be fp32 or bf16, got {dtype!r}")
        self.model = str(model)
        self.device = torch.device(device or "cpu")
        self.torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
        self.sam = SamModel.from_pretrained(self.model).to(self.device, self.torch_dtype).eval()
        self.processor = AutoImageProcessor.from_pretrained(self.model)
        self.points_per_side, self.points_per_batch = points_per_side, points_per_batch
        self.requested_batch = points_per_batch
        self.pred_iou_thresh, self.stability_score_thresh = pred_iou_thresh, stability_score_thresh
        self.dtype = dtype
        self.prompt_batch_fallbacks = 0

    def fingerprint(self) -> dict:
        # the masks are the pipeline's: the same identity as SamSegmenter's (the batch asked for, not a fallback)
        return sam_fingerprint(self.model, self.points_per_side, self.pred_iou_thresh, self.stability_score_thresh,
                               self.requested_batch, self.dtype)

    @torch.inference_mode()
    def _kept(self, seen: Image.Image) -> _Kept:
        """The pipeline's masks of `seen` in NMS order: their low-resolution logits (upsampled on demand),
        boxes (int [N, 4] left, top, right, bottom inclusive) and areas (pixels > 0), on the CPU."""
        from torchvision.ops.boxes import batched_nms

        processor = self.processor
        target = processor.size.get("longest_edge", processor.size.get("height"))
        _, points, cropped, labels = processor.generate_crop_boxes(seen, target, 0, 512 / 1500, self.points_per_side, 1)
        inputs = processor(images=cropped, return_tensors="pt")
        pixels = inputs["pixel_values"].to(self.device, self.torch_dtype)
        original = [int(v) for v in inputs["original_sizes"][0]]
        reshaped = [int(v) for v in inputs["reshaped_input_sizes"][0]]
        pad = (processor.pad_size["height"], processor.pad_size["width"])
        embeddings = self.sam.get_image_embeddings(pixels)
        kept_low, scores, boxes, areas = [], [], [], []
        geometry = None
        for low_res, iou in self._decoded(embeddings, points, labels, points.shape[1]):
            low_res, iou = low_res[0].flatten(0, 1), iou[0].flatten(0, 1)   # [P*3, 256, 256], prompt-major
            chosen = torch.nonzero(iou > self.pred_iou_thresh if self.pred_iou_thresh > 0.0
                                   else torch.ones_like(iou, dtype=torch.bool)).flatten()
            if not len(chosen):
                continue
            if geometry is None:
                geometry = _geometry(low_res.shape[-2:], pad, reshaped, original, low_res.device)
            logits = low_res[chosen].float()
            counts, box = _threshold_statistics(logits, geometry)
            keep = torch.ones(len(chosen), dtype=torch.bool, device=logits.device)
            if self.stability_score_thresh > 0.0:    # _compute_stability_score's int32 / int32, from exact counts
                keep &= (counts[:, 0].to(torch.int32) / counts[:, 1].to(torch.int32)) > self.stability_score_thresh
            kept_low.append(logits[keep])
            scores.append(iou[chosen][keep].float().cpu())
            boxes.append(box[keep].cpu())
            areas.append(counts[keep, 2].cpu())
        if not kept_low:
            empty = torch.zeros((0, 4), dtype=torch.long)
            return _Kept(torch.zeros((0, 1, 1)), empty, torch.zeros(0, dtype=torch.long), pad, reshaped, original)
        scores_all, boxes_all = torch.cat(scores), torch.cat(boxes)
        order = batched_nms(boxes_all.float(), scores_all, torch.zeros(boxes_all.shape[0]), NMS_IOU)
        return _Kept(torch.cat(kept_low)[order.to(self.device)], boxes_all[order], torch.cat(areas)[order], pad,
                     reshaped, original)

    def _decoded(self, embeddings, points, labels, n_points):
        """(pred_masks, iou_scores) of each prompt batch, the batch halved on out-of-memory."""
        start = 0
        while start < n_points:
            size = self.points_per_batch
            try:
                output = self.sam(image_embeddings=embeddings,
                                  input_points=points[:, start:start + size].to(self.device, self.torch_dtype),
                                  input_labels=labels[:, start:start + size].to(self.device))
            except RuntimeError as error:
                if not is_out_of_memory(error) or size == 1:
                    raise
                self.points_per_batch = size // 2
                self.prompt_batch_fallbacks += 1
                log.warning("SAM: %d prompts per batch ran out of memory; trying %d", size, self.points_per_batch)
                release_cached_memory(self.device)
                continue
            yield output.pred_masks, output.iou_scores
            start += size

    def masks(self, image: Image.Image) -> list[np.ndarray]:
        """Boolean [H, W] masks at the image's size, as `SamSegmenter.masks` gives them."""
        rgb = image.convert("RGB")
        seen = sam_input(rgb)
        masks = [np.asarray(m) for m in self._kept(seen).binary().cpu().numpy()]
        if seen.size == rgb.size:
            return masks
        return [np.asarray(Image.fromarray(m).resize(rgb.size, Image.NEAREST)) for m in masks]

    def segments(self, image: Image.Image, min_area: float, max_area: float) -> tuple[int, list[Segment]]:
        """(number of masks, `segments_of(image, masks, min_area, max_area)` without the crops)."""
        rgb = image.convert("RGB")
        seen = sam_input(rgb)
        found = self._kept(seen)
        total = rgb.width * rgb.height
        kept = []
        if seen.size != rgb.size:    # the release's NEAREST resize back, then the host's filter
            for index, mask in enumerate(found.binary().cpu().numpy()):
                full = np.asarray(Image.fromarray(mask).resize(rgb.size, Image.NEAREST))
                fraction = float(np.count_nonzero(full)) / total
                if fraction > 0 and min_area <= fraction <= max_area:
                    kept.append(Segment(index, fraction, mask_bbox(full)))
            return len(found.boxes), kept
        for index, (area, box) in enumerate(zip(found.areas.tolist(), found.boxes.tolist(), strict=True)):
            fraction = float(area) / total
            if fraction > 0 and min_area <= fraction <= max_area:
                x1, y1, right, bottom = box
                kept.append(Segment(index, fraction, {"x1": x1, "y1": y1, "x2": right + 1, "y2": bottom + 1,
                                                      "width": right + 1 - x1, "height": bottom + 1 - y1}))
        return len(found.boxes), kept


class _Kept:
    """The kept masks' low-resolution logits [N, h, w] (device), boxes [N, 4] and areas [N] (CPU)."""

    def __init__(self, low_res, boxes, areas, pad, reshaped, original):
        self.low_res, self.boxes, self.areas = low_res, boxes, areas
        self.pad, self.reshaped, self.original = pad, reshaped, original

    def binary(self) -> torch.Tensor:
        """bool [N, H, W] on the device: post_process_masks' upsampling, > 0, chunk by chunk."""
        if not len(self.low_res):
            return torch.zeros((0, *self.original), dtype=torch.bool, device=self.low_res.device)
        step = max(1, UPSAMPLE_BYTES // (4 * self.original[0] * self.original[1]))
        return torch.cat([_upsampled(self.low_res[start:start + step][None], self.pad, self.reshaped,
                                     self.original)[0] > 0.0 for start in range(0, len(self.low_res), step)])


class _Axis:
    """One axis of the upsampling chain (low-res -> padded input size, unpadded, -> image size) as a linear
    map: pixel p = sum_k weights[p, k] * low[start[p] + k]. Pixels are grouped by `start` (monotone):
    `count[i]` pixels start at low-res index i, the first of them `first[i]`."""

    def __init__(self, n_low: int, pad: int, reshaped: int, original: int, device, rows: bool):
        # the chain's own weights: each low-res index one-hot through the same two interpolations (the other
        # axis 1 -> 1, weight exactly 1); float32 products of the per-stage weights
        probe = torch.eye(n_low, device=device).reshape(1, n_low, n_low, 1)
        if rows:
            chain = _upsampled(probe, (pad, 1), [reshaped, 1], [original, 1])[0, :, :, 0]
        else:
            chain = _upsampled(probe.transpose(2, 3).contiguous(), (1, pad), [1, reshaped], [1, original])[0, :, 0, :]
        chain = chain.T.double()                                   # [original, n_low]
        used = chain != 0
        index = torch.arange(n_low, device=device)
        start = torch.where(used, index, n_low).amin(1)
        end = torch.where(used, index, -1).amax(1)
        if bool((start[1:] < start[:-1]).any()):
            raise RuntimeError("SAM's upsampling chain is not monotone on this axis")
        self.span = int((end - start).amax()) + 1                  # low-res values a pixel mixes (<= 3)
        self.extent = int(end.amax()) + 1                          # low-res indices used at all
        columns = (start[:, None] + torch.arange(self.span, device=device)).clamp(max=n_low - 1)
        self.weights = torch.gather(chain, 1, columns)             # [original, span]
        self.weights[start[:, None] + torch.arange(self.span, device=device) >= n_low] = 0.0
        self.start = start
        self.count = torch.bincount(start, minlength=self.extent)[:self.extent]
        self.first = torch.full((self.extent,), original, device=device, dtype=torch.long).scatter_reduce(
            0, start, torch.arange(original, device=device), "amin")
        self.most = int(self.count.amax())


class _Geometry:
    def __init__(self, low_shape, pad, reshaped, original, device):
        self.pad, self.reshaped, self.original = pad, reshaped, original
        self.rows = _Axis(int(low_shape[0]), pad[0], reshaped[0], original[0], device, rows=True)
        self.cols = _Axis(int(low_shape[1]), pad[1], reshaped[1], original[1], device, rows=False)


_GEOMETRIES: dict = {}


def _geometry(low_shape, pad, reshaped, original, device) -> _Geometry:
    key = (tuple(low_shape), tuple(pad), tuple(reshaped), tuple(original), str(device))
    if key not in _GEOMETRIES:
        _GEOMETRIES.clear()
        _GEOMETRIES[key] = _Geometry(low_shape, pad, reshaped, original, device)
    return _GEOMETRIES[key]


THRESHOLDS = (1.0, -1.0, 0.0)   # stability's mask_threshold +- offset, then the binarization
# the float64 evaluation from the chain's weights is within 3.4 * 2**-24 of the largest |logit| of the window
# of the chain's float32 values (measured at the three sizes and a small one; a bound: about 12 * 2**-24)
RELATIVE_TOL = 2.0 ** -19
CELLS_AT_A_TIME = 1 << 16
BAND_SHARE_LIMIT = 0.1          # masks with more of the image's pixels in straddling windows: upsampled


def _threshold_statistics(logits: torch.Tensor, geometry: _Geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """For each low-res mask [N, h, w] (float32) of the image's upsampled logits V (post_process_masks'
    chain): counts [N, 3] of pixels with V > 1, V > -1, V > 0 and the box [N, 4] (left, top, right, bottom,
    inclusive; zeros if empty) of V > 0, exactly as computed on the upsampled masks, without upsampling.

    Each pixel of V is a convex combination of a span x span window of low-res values, so a window whose
    min is above a threshold t puts all of its pixels above t, one whose max is below t none; only pixels
    of windows that straddle t (the masks' outlines) are evaluated, from the chain's weights, in float64.
    That value is within float32 rounding of the chain's own; a mask with such a pixel within
    RELATIVE_TOL * (its window's max |logit|) of t, a non-finite logit, or more than BAND_SHARE_LIMIT of the
    image in straddling windows is upsampled and counted the pipeline's way."""
    from torch.nn import functional as F
    rows, cols = geometry.rows, geometry.cols
    n = logits.shape[0]
    device = logits.device
    low = logits[:, :rows.extent, :cols.extent]
    padded = F.pad(low[:, None], (0, cols.span - 1, 0, rows.span - 1), mode="replicate")[:, 0]
    high, least = _window_extremes(padded, rows.span, cols.span)                 # [N, h, w] each
    tol = RELATIVE_TOL * torch.maximum(high.flatten(1).amax(1), -least.flatten(1).amin(1))   # [N]
    unsure = ~torch.isfinite(tol)              # a NaN or infinite logit: the pipeline's way
    has_pixels = (rows.count > 0)[:, None] & (cols.count > 0)[None, :]
    row_pixels, col_pixels = rows.count.double(), cols.count.float()
    counts = torch.zeros((n, len(THRESHOLDS)), dtype=torch.long, device=device)
    undecided = []
    for k, t in enumerate(THRESHOLDS):
        above = least > (t + tol)[:, None, None]
        maybe = (high > (t - tol)[:, None, None]) & ~above & has_pixels
        # pixels of the cells above t: 0/1 times small counts, summed in float32: exact integers below 2**24
        counts[:, k] = ((above.float() @ col_pixels).double() @ row_pixels).round().long()
        undecided.append(maybe)
        if t == 0.0:
            sure = above & has_pixels
    big = torch.iinfo(torch.long).max
    top = torch.where(sure.any(2), rows.first, big).amin(1)
    bottom = torch.where(sure.any(2), rows.first + rows.count - 1, -1).amax(1)
    left = torch.where(sure.any(1), cols.first, big).amin(1)
    right = torch.where(sure.any(1), cols.first + cols.count - 1, -1).amax(1)
    band = undecided[0] | undecided[1] | undecided[2]
    # a mask that is mostly outline (noisy logits) is cheaper upsampled than evaluated pixel by pixel
    band_pixels = (band.float() @ col_pixels).double() @ row_pixels
    unsure |= band_pixels > BAND_SHARE_LIMIT * float(row_pixels.sum() * col_pixels.sum())
    band &= ~unsure[:, None, None]
    cells = torch.nonzero(band)
    row_offsets = torch.arange(rows.most, device=device)
    col_offsets = torch.arange(cols.most, device=device)
    row_window = torch.arange(rows.span, device=device)
    col_window = torch.arange(cols.span, device=device)
    for begin in range(0, len(cells), CELLS_AT_A_TIME):
        m, i, j = cells[begin:begin + CELLS_AT_A_TIME].unbind(1)
        window = low[m[:, None, None], (i[:, None] + row_window).clamp(max=rows.extent - 1)[:, :, None],
                     (j[:, None] + col_window).clamp(max=cols.extent - 1)[:, None, :]].double()
        y = rows.first[i][:, None] + row_offsets                                  # [c, most_rows]
        x = cols.first[j][:, None] + col_offsets
        valid = ((row_offsets < rows.count[i][:, None])[:, :, None] & (col_offsets < cols.count[j][:, None])[:, None])
        y_weights = rows.weights[y.clamp(max=len(rows.weights) - 1)]              # [c, most_rows, span]
        x_weights = cols.weights[x.clamp(max=len(cols.weights) - 1)]
        value = torch.einsum("cpk,ckl,cql->cpq", y_weights, window, x_weights)
        cell_tol = RELATIVE_TOL * torch.maximum(high[m, i, j].abs(), least[m, i, j].abs()).double()[:, None, None]
        for k, t in enumerate(THRESHOLDS):
            inside = valid & undecided[k][m, i, j][:, None, None]
            hit = inside & (value > t)
            counts[:, k].index_add_(0, m, hit.flatten(1).sum(1))
            near = (inside & ((value - t).abs() <= cell_tol)).flatten(1).any(1)
            unsure.index_fill_(0, m[near], True)
            if t == 0.0:
                any_row, any_col = hit.any(2), hit.any(1)                          # [c, most_rows], [c, most_cols]
                top.scatter_reduce_(0, m, torch.where(any_row, y, big).amin(1), "amin")
                bottom.scatter_reduce_(0, m, torch.where(any_row, y, -1).amax(1), "amax")
                left.scatter_reduce_(0, m, torch.where(any_col, x, big).amin(1), "amin")
                right.scatter_reduce_(0, m, torch.where(any_col, x, -1).amax(1), "amax")
    box = torch.stack([left, top, right, bottom], dim=1)
    box[right < 0] = 0
    if bool(unsure.any()):
        redo = torch.nonzero(unsure).flatten()
        exact_counts, exact_box = _upsampled_statistics(logits[redo], geometry)
        counts[redo], box[redo] = exact_counts, exact_box
    return counts, box


def _window_extremes(values: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Max and min of each rows x cols window (by its top-left corner) of [N, h + rows - 1, w + cols - 1]."""
    high = low = values
    for axis, span in ((1, rows), (2, cols)):
        size = high.shape[axis] - span + 1
        high_next, low_next = high.narrow(axis, 0, size), low.narrow(axis, 0, size)
        for shift in range(1, span):
            high_next = torch.maximum(high_next, high.narrow(axis, shift, size))
            low_next = torch.minimum(low_next, low.narrow(axis, shift, size))
        high, low = high_next, low_next
    return high, low


def _upsampled_statistics(logits: torch.Tensor, geometry: _Geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """`_threshold_statistics` the pipeline's way: upsample (in chunks), compare, count, box."""
    from transformers.models.sam.image_processing_sam import _batched_mask_to_box
    original = geometry.original
    counts, boxes = [], []
    step = max(1, UPSAMPLE_BYTES // (4 * original[0] * original[1]))
    for begin in range(0, len(logits), step):
        full = _upsampled(logits[begin:begin + step][None], geometry.pad, geometry.reshaped, original)[0]
        counts.append(torch.stack([(full > t).flatten(1).sum(1) for t in THRESHOLDS], dim=1))
        boxes.append(_batched_mask_to_box(full > 0.0).long())
    return torch.cat(counts), torch.cat(boxes)


def _upsampled(low_res: torch.Tensor, pad: tuple[int, int], reshaped: list[int], original: list[int]) -> torch.Tensor:
    """SamImageProcessor.post_process_masks without binarizing: to the padded input size, unpadded, to the
    image size (bilinear, align_corners False, per mask: a mask's values do not depend on the others)."""
    from torch.nn import functional as F
    upsampled = F.interpolate(low_res, pad, mode="bilinear", align_corners=False)
    upsampled = upsampled[..., :reshaped[0], :reshaped[1]]
    return F.interpolate(upsampled, original, mode="bilinear", align_corners=False)


def plant_masks(sam, n_masks: int, image_size: tuple[int, int], seed: int = 0, small_share: float = 0.5,
                on_time=None, points_per_side: int = 32):
    """Test and benchmark hook: make a (random-weight) SamModel's prompt decoding predict `n_masks`
    distinct confident masks for images of `image_size` (w, h, as SAM sees them), so that every
    post-processing step runs as with trained weights.

    `n_masks` elliptic blobs are drawn in the low-resolution mask frame (its unpadded part), each centred
    on a point of the `points_per_side` prompt grid, a
    `small_share` of them under 1 % of the image (dropped by the area filter), the others 1.2-15 %, no
    two with box IoU above 0.5. Every prompt point inside a blob predicts it in all three multimask
    outputs (logits 20 inside, -17 outside: stable, and, as a trained model's, not exactly 0 halfway) with IoU
    0.99 down to 0.90 by blob; every other prediction has IoU 0
    (dropped by the IoU filter). NMS keeps one mask per blob. `on_time(seconds)` is told each call's own
    cost (a benchmark leaves it out). Returns the hook's handle (`.remove()`)."""
    import time
    rng = np.random.default_rng(seed)
    side = int(sam.config.vision_config.image_size)
    scale = side / max(image_size)
    planted: dict = {}

    def draw(low: int) -> tuple[torch.Tensor, torch.Tensor]:
        height = int(image_size[1] * scale + 0.5) * low / side
        width = int(image_size[0] * scale + 0.5) * low / side
        yy, xx = np.mgrid[0:low, 0:low] + 0.5
        blobs, boxes = [], []
        for _ in range(50 * n_masks):
            if len(blobs) == n_masks:
                break
            small = len(blobs) < round(small_share * n_masks)
            fraction = float(np.exp(rng.uniform(np.log(0.003), np.log(0.009)) if small
                                    else rng.uniform(np.log(0.012), np.log(0.15))))
            aspect = rng.uniform(0.5, 2.0)
            ry = np.sqrt(fraction * height * width / (np.pi * aspect))
            rx = ry * aspect
            # centred on a prompt point of the segmenter's grid, so that some prompt predicts it
            cy = (rng.integers(points_per_side) + 0.5) / points_per_side * height
            cx = (rng.integers(points_per_side) + 0.5) / points_per_side * width
            blob = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1.0
            box = (cx - rx, cy - ry, cx + rx, cy + ry)
            if blob.sum() < 2 or any(_box_iou(box, other) > 0.5 for other in boxes):
                continue
            blobs.append(blob)
            boxes.append(box)
        logits = torch.from_numpy(np.where(np.stack(blobs), 20.0, -17.0).astype(np.float32))
        return logits, torch.linspace(0.99, 0.90, len(blobs))

    def hook(module, args, kwargs, output):
        start = time.perf_counter()
        low = output.pred_masks.shape[-1]
        if low not in planted:
            planted[low] = draw(low)
        logits, scores = planted[low]
        points = kwargs["input_points"][0, :, 0].float().cpu()     # [P, 2]: x, y in the input frame
        col = (points[:, 0] * low / side).long().clamp(0, low - 1)
        row = (points[:, 1] * low / side).long().clamp(0, low - 1)
        inside = (logits > 0)[:, row, col]                          # [blobs, P]
        areas = (logits > 0).sum(dim=(1, 2))
        masks = torch.full_like(output.pred_masks, -20.0)
        ious = torch.zeros_like(output.iou_scores)
        for p in range(points.shape[0]):
            hits = torch.nonzero(inside[:, p]).flatten()
            if len(hits):
                j = int(hits[areas[hits].argmin()])   # the smallest blob that holds the point: none is hidden
                masks[0, p, :] = logits[j].to(masks.device, masks.dtype)
                ious[0, p, :] = scores[j]
        output.pred_masks, output.iou_scores = masks, ious
        if on_time is not None:
            on_time(time.perf_counter() - start)
        return output

    return sam.register_forward_hook(hook, with_kwargs=True)


def _box_iou(a, b) -> float:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union
