"""SAM automatic mask generation without the pipeline's per-mask overheads, same masks in the same order.

`DirectSamSegmenter` gives what transformers' "mask-generation" pipeline gives (crops_n_layers=0, the
released setting) for the installed transformers (5.x; read from
transformers/pipelines/mask_generation.py and models/sam/image_processing_sam.py):

  pipeline                                           here
  preprocess: generate_crop_boxes (32x32 grid),      the same calls, on the CPU as there
    the image processor (resize 1024, pad)
  image embedding once, prompts in batches of        the same; prompt batches halve on out-of-memory
    points_per_batch (multimask: 3 masks a prompt)     (each prompt's masks do not depend on its batch)
  post_process_masks: EVERY mask bilinear to         only the masks with iou > pred_iou_thresh are
    1024, unpadded, bilinear to the image size         upsampled (the same two interpolations, in chunks)
  filter_masks: iou > thresh, stability > thresh     the same functions on the upsampled logits, on the
    (logits > +-1), binarize > 0, boxes; masks         device; no RLE: the kept binary masks stay as they
    RLE-encoded                                        are
  postprocess: batched_nms(boxes, iou, 0.7) on the   the same call on the same CPU tensors, same order
    CPU; every kept mask RLE-decoded
  (crop box = the whole image, so the crop-edge filter and the padding are no-ops with 0 crop layers)

`segments(image, min_area, max_area)` then applies `segments_of`'s area filter and tight box on the
device (area = mask.sum(); the box is the NMS box, inclusive, + 1 on the right/bottom) and copies no
mask to the host. Images SAM sees thumbnailed (> 4000 x 3000) take the release's NEAREST resize of
each kept mask on the host, as `SamSegmenter` does. Equality with the pipeline is tested on the
rehearsal's tiny SAM (tests/test_sam_segments.py).
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
    def _kept(self, seen: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        """The pipeline's masks of `seen` (bool [N, h, w] on the device, NMS order) and their boxes
        (int [N, 4] left, top, right, bottom inclusive, on the CPU)."""
        from torchvision.ops.boxes import batched_nms
        from transformers.models.sam.image_processing_sam import _batched_mask_to_box, _compute_stability_score

        processor = self.processor
        target = processor.size.get("longest_edge", processor.size.get("height"))
        _, points, cropped, labels = processor.generate_crop_boxes(seen, target, 0, 512 / 1500, self.points_per_side, 1)
        inputs = processor(images=cropped, return_tensors="pt")
        pixels = inputs["pixel_values"].to(self.device, self.torch_dtype)
        original = [int(v) for v in inputs["original_sizes"][0]]
        reshaped = [int(v) for v in inputs["reshaped_input_sizes"][0]]
        pad = (processor.pad_size["height"], processor.pad_size["width"])
        embeddings = self.sam.get_image_embeddings(pixels)
        masks, scores, boxes = [], [], []
        n_points = points.shape[1]
        for low_res, iou in self._decoded(embeddings, points, labels, n_points):
            low_res, iou = low_res[0].flatten(0, 1), iou[0].flatten(0, 1)   # [P*3, 256, 256], prompt-major
            chosen = torch.nonzero(iou > self.pred_iou_thresh if self.pred_iou_thresh > 0.0
                                   else torch.ones_like(iou, dtype=torch.bool)).flatten()
            step = max(1, UPSAMPLE_BYTES // (4 * original[0] * original[1]))
            for start in range(0, len(chosen), step):
                index = chosen[start:start + step]
                logits = _upsampled(low_res[index][None].float(), pad, reshaped, original)[0]
                keep = torch.ones(len(index), dtype=torch.bool, device=logits.device)
                if self.stability_score_thresh > 0.0:
                    keep &= _compute_stability_score(logits, 0.0, 1) > self.stability_score_thresh
                binary = logits[keep] > 0.0
                masks.append(binary)
                scores.append(iou[index][keep].float().cpu())
                boxes.append(_batched_mask_to_box(binary).cpu())
        if not masks:
            empty = torch.zeros((0, *original), dtype=torch.bool, device=self.device)
            return empty, torch.zeros((0, 4), dtype=torch.long)
        scores_all, boxes_all = torch.cat(scores), torch.cat(boxes)
        order = batched_nms(boxes_all.float(), scores_all, torch.zeros(boxes_all.shape[0]), NMS_IOU)
        return torch.cat(masks)[order.to(self.device)], boxes_all[order]

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
        masks = [np.asarray(m) for m in self._kept(seen)[0].cpu().numpy()]
        if seen.size == rgb.size:
            return masks
        return [np.asarray(Image.fromarray(m).resize(rgb.size, Image.NEAREST)) for m in masks]

    def segments(self, image: Image.Image, min_area: float, max_area: float) -> tuple[int, list[Segment]]:
        """(number of masks, `segments_of(image, masks, min_area, max_area)` without the crops)."""
        rgb = image.convert("RGB")
        seen = sam_input(rgb)
        masks, boxes = self._kept(seen)
        total = rgb.width * rgb.height
        kept = []
        if seen.size != rgb.size:    # the release's NEAREST resize back, then the host's filter
            for index, mask in enumerate(masks.cpu().numpy()):
                full = np.asarray(Image.fromarray(mask).resize(rgb.size, Image.NEAREST))
                fraction = float(np.count_nonzero(full)) / total
                if fraction > 0 and min_area <= fraction <= max_area:
                    kept.append(Segment(index, fraction, mask_bbox(full)))
            return len(masks), kept
        areas = masks.sum(dim=(1, 2)).cpu().tolist() if len(masks) else []
        for index, (area, box) in enumerate(zip(areas, boxes.tolist(), strict=True)):
            fraction = float(area) / total
            if fraction > 0 and min_area <= fraction <= max_area:
                x1, y1, right, bottom = box
                kept.append(Segment(index, fraction, {"x1": x1, "y1": y1, "x2": right + 1, "y2": bottom + 1,
                                                      "width": right + 1 - x1, "height": bottom + 1 - y1}))
        return len(masks), kept


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
    outputs (logits +-20: stable) with IoU 0.99 down to 0.90 by blob; every other prediction has IoU 0
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
        logits = torch.from_numpy(np.where(np.stack(blobs), 20.0, -20.0).astype(np.float32))
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
