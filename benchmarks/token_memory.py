"""Peak memory of the token-level term L_tok (forward + backward) at the paper's shapes, against the
naive B x B x T x P fp32 similarity tensor.

    python benchmarks/token_memory.py                 # T=248, P=257, E=768; B=16 and 128 = 8 x 16
    python benchmarks/token_memory.py --global-128    # also one 128-way L_tok (minutes on a CPU)
    python benchmarks/token_memory.py --small         # tiny shapes (what the tests run)

Configurations, each on fp32 token features that require grad (as after the towers' forward):
  naive           the reference one-einsum loss (`losses.token._token_alignment_loss_naive`), B=16
  training        the training path (`training.objective.token_term`: chunks of TOKEN_LOSS_CHUNK
                  captions, recomputed in backward when a chunk's cosines exceed 256 MiB), B=16
  block_diagonal  B=128 as `recipe.compute_batch` computes it: 8 groups of 16, one token term per
                  group on its rows, summed, one backward (every group's graph is alive at once)
  training B=128  (--global-128) the training path on one batch of 128: a 128-way softmax, chunks
                  of 16 captions with 128 x 16 x 257 x 248 cosines (522 MB), recomputed in backward

Measured on CPU as the growth of the process's peak resident set during the call: the peak
(VmHWM) is reset to the current RSS through /proc/self/clear_refs and glibc's free memory is
handed back (malloc_trim) before each call, after one unmeasured warm-up call. It includes the
input gradients (B * (P + T) * E * 4 bytes, reported separately). Where /proc is missing (not
Linux) only the analytic sizes are written. Captions have all T positions valid (the largest case).
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from throughput import ROOT, append_jsonl, environment

from hnclip.losses.objective import TOKEN_LOSS_CHUNK, token_term
from hnclip.losses.token import _token_alignment_loss_naive
from hnclip.models.towers import Encoded

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "token_memory.jsonl"
SCALE = 100.0  # exponentiated logit scale (CLIP's ceiling); does not change memory


@dataclass(frozen=True)
class Shapes:
    tokens: int       # T, caption tokens
    patches: int      # P, image tokens
    dim: int          # E, projection width
    group: int        # contrastive group (micro-batch)
    groups: int       # groups per compute batch


PAPER = Shapes(tokens=248, patches=257, dim=768, group=16, groups=8)
SMALL = Shapes(tokens=16, patches=17, dim=32, group=4, groups=2)


def naive_tensor_bytes(batch: int, shapes: Shapes) -> int:
    """fp32 bytes of the full B x B x T x P cosine tensor of one B-way token loss."""
    return batch * batch * shapes.tokens * shapes.patches * 4


def _loss(config: str, image_tokens, text_tokens, mask, shapes: Shapes) -> torch.Tensor:
    scale = torch.tensor(SCALE)
    if config == "naive":
        return _token_alignment_loss_naive(image_tokens, text_tokens, mask, scale)
    if config == "block_diagonal":
        rows = [slice(start, start + shapes.group) for start in range(0, image_tokens.shape[0], shapes.group)]
        return sum(token_term(Encoded(image_tokens=image_tokens[r], text_tokens=text_tokens[r],
                                      text_padding_mask=mask[r]), scale) for r in rows)
    return token_term(Encoded(image_tokens=image_tokens, text_tokens=text_tokens, text_padding_mask=mask), scale)


# ---- peak resident memory of a call (Linux) -----------------------------------------------------
def _status_bytes(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{key}:\s+(\d+) kB", text, re.MULTILINE).group(1)) * 1024


def _reset_peak() -> int:
    """Hand freed heap memory back, reset the peak RSS to the current RSS, return the current RSS."""
    libc_name = ctypes.util.find_library("c")
    if libc_name and hasattr(ctypes.CDLL(libc_name), "malloc_trim"):
        ctypes.CDLL(libc_name).malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def peak_memory_supported() -> bool:
    try:
        _reset_peak()
        return True
    except OSError:
        return False


def measure(config: str, batch: int, shapes: Shapes, measured: bool) -> dict:
    generator = torch.Generator().manual_seed(0)
    image_tokens = torch.randn(batch, shapes.patches, shapes.dim, generator=generator).requires_grad_(True)
    text_tokens = torch.randn(batch, shapes.tokens, shapes.dim, generator=generator).requires_grad_(True)
    mask = torch.zeros(batch, shapes.tokens, dtype=torch.bool)
    groups = shapes.groups if config == "block_diagonal" else 1
    record = {"config": config, "batch": batch, "softmax_size": batch // groups, "groups": groups,
              "T": shapes.tokens, "P": shapes.patches, "E": shapes.dim,
              "chunk_size": None if config == "naive" else TOKEN_LOSS_CHUNK,
              "naive_tensor_bytes": naive_tensor_bytes(batch, shapes),
              "naive_block_diagonal_bytes": groups * naive_tensor_bytes(batch // groups, shapes),
              "input_grad_bytes": batch * (shapes.patches + shapes.tokens) * shapes.dim * 4}
    _loss(config, image_tokens, text_tokens, mask, shapes).backward()  # warm-up: one-time allocations
    image_tokens.grad = text_tokens.grad = None
    start_rss = _reset_peak() if measured else None
    started = time.perf_counter()
    _loss(config, image_tokens, text_tokens, mask, shapes).backward()
    record["seconds"] = time.perf_counter() - started
    peak = _status_bytes("VmHWM") - start_rss if measured else None
    record.update(measured_peak_bytes=peak, measured_peak_gb=None if peak is None else peak / 1e9,
                  measurement="VmHWM growth (/proc/self/clear_refs)" if measured else "not measured (no /proc)")
    if peak is not None:
        record["peak_over_naive_tensor"] = peak / record["naive_tensor_bytes"]
    return record


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help=f"tiny shapes {SMALL} instead of {PAPER}")
    parser.add_argument("--global-128", action="store_true", help="also one 128-way token loss (slow on CPU)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines are appended here")
    args = parser.parse_args(argv)
    shapes = SMALL if args.small else PAPER
    large = shapes.group * shapes.groups
    configs = [("naive", shapes.group), ("training", shapes.group), ("block_diagonal", large)]
    if args.global_128:
        configs.append(("training", large))
    measured, records = peak_memory_supported(), []
    for config, batch in configs:
        record = {"benchmark": "token_memory", **measure(config, batch, shapes, measured),
                  **environment(torch.device("cpu"))}
        append_jsonl(args.out, record)
        peak = "n/a" if record["measured_peak_gb"] is None else f"{record['measured_peak_gb']:.3f} GB"
        print(f"{config:15s} B={batch:4d}  peak {peak}  naive tensor {record['naive_tensor_bytes'] / 1e9:.3f} GB  "
              f"({record['seconds']:.1f} s)", flush=True)
        records.append(record)
    return records


if __name__ == "__main__":
    main(sys.argv[1:])
