"""The token term's share of an HN-CLIP micro-batch, before and after its custom autograd function.

    nice -n 10 python benchmarks/token_term_profile.py     # Long-CLIP-L shapes on the CPU (minutes)
    python benchmarks/token_term_profile.py --device cuda  # on a GPU: the micro-batch under bf16 autocast
    python benchmarks/token_term_profile.py --small        # tiny shapes (what the tests run)
    python benchmarks/token_term_profile.py --groups 8     # a compute-batch forward's 8 groups: per group
                                                           # against one call (`--groups` mode, below)

Shapes (paper): ViT-L/14 at 224 px gives 256 patch tokens (the class token is the pooled feature, not a
token of the term) and the 768-wide text tower 248 positions, trimmed to the micro-batch's longest
caption (captions of 150 +- 30 tokens, as benchmarks/throughput.py draws them); both projected to 768;
one 16-pair micro-batch, the term's chunk of 16 captions (`losses.objective.TOKEN_LOSS_CHUNK`); the term
in fp32 (as training computes it, on the upcast token features), the micro-batch's forward in fp32 on the
CPU and under bf16 autocast on CUDA (the paper profile's precision, with its TF32 for fp32 matmuls).

Two implementations of L_tok, on the same token features:
  previous  the implementation this project trained with up to commit 03d5ed8 (copied below, unchanged:
            generic autograd over one masked copy of the cosines and two amax reductions, a chunk
            recomputed in backward above 256 MiB)
  current   `hnclip.losses.token.token_alignment_loss` (one autograd function per chunk; argmax indices
            saved, the gradient scattered once)
With --groups G: the token terms of a compute-batch forward of G micro-batches (the concatenated token
features of G groups, each of its own captions' lengths, padded to the forward's longest) computed one group
at a time (`objective.token_term` on each group's rows, as before) and in one block-diagonal call
(`objective.grouped_token_similarities` + each group's cross-entropy, what `compute_batch` runs now): both
timed (forward + backward, interleaved, median of --repeats), their operator calls counted (torch.profiler;
on CUDA the kernels launched too) and their losses and gradients compared (torch.equal). Its own record.

Each is timed as forward + backward of the term alone (--repeats, median, each after a warm-up pass, the two
implementations interleaved so both see the same load on a shared machine), and its
autograd-saved bytes counted (a tensor saved twice counts twice). Unless --term-only, one whole HN-CLIP
micro-batch (random-initialised ViT-L-14-quickgelu at context 248: `loss_terms` forward and `.backward()`,
the optimizer's update excluded) is also timed (--step-repeats after --step-warmup) with each implementation
of --step-implementations: the term's share of the micro-batch is its isolated time over the micro-batch's
time with the same implementation. An implementation whose micro-batch is not timed (a shared 2-core CPU
takes many minutes per Long-CLIP-L micro-batch) gets a derived share: its term over the timed micro-batch
less the timed implementation's term plus its own. One JSON line is appended to --out.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from throughput import CONTEXT, HN_CLIP, ROOT, Shapes, append_jsonl, environment, random_inputs
from torch.utils.checkpoint import checkpoint

import hnclip.losses.distributed as distributed
from hnclip.losses.objective import TOKEN_LOSS_CHUNK, loss_terms
from hnclip.losses.token import token_alignment_loss
from hnclip.models.factory import create
from hnclip.models.towers import encode_batch
from hnclip.runtime.device import autocast_context, configure_tf32

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "token_term_profile.jsonl"
PAPER = {"model": "ViT-L-14-quickgelu", "image_size": 224, "patches": 256, "embed": 768, "micro_batch": 16,
         "caption_tokens": 150}
SMALL = {"model": "hnclip-tiny", "image_size": 64, "patches": 64, "embed": 64, "micro_batch": 4,
         "caption_tokens": 20}


# ---- the previous implementation (commit 03d5ed8, src/hnclip/losses/token.py), unchanged ----------------
PREVIOUS_RECOMPUTE_ABOVE_BYTES = 256 * 2**20


def _previous_chunk_scores(image_tokens, text_tokens, text_padding_mask):
    cosines = torch.einsum("ipd,jtd->ijpt", image_tokens, text_tokens)
    padding = text_padding_mask[None, :, None, :]
    best_word_per_patch = cosines.masked_fill(padding, float("-inf")).amax(dim=-1)
    sim_i2t = best_word_per_patch.mean(dim=-1)
    best_patch_per_word = cosines.amax(dim=-2).masked_fill(padding[:, :, 0], 0.0)
    words_per_caption = (~text_padding_mask).sum(dim=-1).to(best_patch_per_word.dtype)
    sim_t2i = best_patch_per_word.sum(dim=-1) / words_per_caption
    return sim_i2t, sim_t2i


def previous_token_alignment_loss(image_tokens, text_tokens, text_padding_mask, logit_scale, chunk_size=None):
    text_tokens = text_tokens.masked_fill(text_padding_mask.unsqueeze(-1), 0.0)
    images, texts = F.normalize(image_tokens, dim=-1), F.normalize(text_tokens, dim=-1)
    chunk_size = texts.shape[0] if chunk_size is None else int(chunk_size)
    chunk_bytes = images.shape[0] * min(chunk_size, texts.shape[0]) * images.shape[1] * texts.shape[1] * 4
    recompute = (torch.is_grad_enabled() and (images.requires_grad or texts.requires_grad)
                 and chunk_bytes > PREVIOUS_RECOMPUTE_ABOVE_BYTES)
    blocks_i2t, blocks_t2i = [], []
    for start in range(0, texts.shape[0], chunk_size):
        chunk = (images, texts[start:start + chunk_size], text_padding_mask[start:start + chunk_size])
        scores = checkpoint(_previous_chunk_scores, *chunk, use_reentrant=False) if recompute \
            else _previous_chunk_scores(*chunk)
        blocks_i2t.append(scores[0])
        blocks_t2i.append(scores[1])
    sim_i2t, sim_t2i = torch.cat(blocks_i2t, dim=1), torch.cat(blocks_t2i, dim=1)
    targets = torch.arange(sim_i2t.shape[0], device=sim_i2t.device)
    return (F.cross_entropy(logit_scale * sim_i2t, targets) + F.cross_entropy(logit_scale * sim_t2i.t(), targets)) / 2


IMPLEMENTATIONS = {"previous": previous_token_alignment_loss, "current": token_alignment_loss}


def token_features(shapes: dict, seed: int = 0):
    """Projected token features of one micro-batch (requiring grad) and the caption padding mask."""
    generator = torch.Generator().manual_seed(seed)
    batch, mean = shapes["micro_batch"], shapes["caption_tokens"]
    low, high = round(0.8 * mean), round(1.2 * mean)
    lengths = torch.randint(low, min(CONTEXT, high) + 1, (batch,), generator=generator)
    length = int(lengths.max())
    padding = torch.arange(length)[None, :] >= lengths[:, None]
    images = torch.randn(batch, shapes["patches"], shapes["embed"], generator=generator).requires_grad_()
    texts = torch.randn(batch, length, shapes["embed"], generator=generator).requires_grad_()
    return images, texts, padding


def saved_bytes(loss_fn, *args) -> int:
    """Bytes autograd keeps for backward (every saved tensor, outside checkpointed regions)."""
    total = []

    def pack(tensor):
        total.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss_fn(*args)
    return sum(total)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_term(loss_fn, images, texts, padding, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        images.grad = texts.grad = None
        _synchronize(images.device)
        start = time.perf_counter()
        loss_fn(images, texts, padding, 100.0, TOKEN_LOSS_CHUNK).backward()
        _synchronize(images.device)
        times.append(time.perf_counter() - start)
    return times[1:]


def time_micro_batch(model, shapes: dict, implementation: str, repeats: int, device: torch.device,
                     warmup: int = 1) -> list[float]:
    """One HN-CLIP micro-batch's forward and backward through `loss_terms`, with `implementation` as the
    token term (patched where `losses.distributed` calls it)."""
    batch_shapes = Shapes(shapes["model"], shapes["image_size"], shapes["caption_tokens"], shapes["micro_batch"], 1,
                          shapes["micro_batch"])
    (images, tokens), = random_inputs(batch_shapes, device)
    autocast = functools.partial(autocast_context, device, "bf16")
    times = []
    with mock.patch.object(distributed, "token_alignment_loss", IMPLEMENTATIONS[implementation]):
        for _ in range(repeats + warmup):
            model.zero_grad(set_to_none=True)
            _synchronize(device)
            start = time.perf_counter()
            loss_terms(model, images, tokens, HN_CLIP, autocast=autocast)["total"].backward()
            _synchronize(device)
            times.append(time.perf_counter() - start)
    return times[warmup:]


def time_forward(model, shapes: dict, device: torch.device) -> float:
    """One no-grad forward of the micro-batch's towers (what checkpointing recomputes in backward)."""
    batch_shapes = Shapes(shapes["model"], shapes["image_size"], shapes["caption_tokens"], shapes["micro_batch"], 1,
                          shapes["micro_batch"])
    (images, tokens), = random_inputs(batch_shapes, device)
    autocast = functools.partial(autocast_context, device, "bf16")
    with torch.no_grad(), autocast():
        _synchronize(device)
        start = time.perf_counter()
        encode_batch(model, images, tokens, with_tokens=True)
        _synchronize(device)
    return time.perf_counter() - start


def grouped_record(shapes: dict, groups: int, repeats: int, device: torch.device) -> dict:
    """Per-group token terms against one block-diagonal call, on one compute-batch forward's features."""
    from hnclip.losses.objective import grouped_token_similarities, token_term
    from hnclip.losses.token import token_loss_of_similarities
    from hnclip.models.towers import Encoded
    parts = [token_features(shapes, seed) for seed in range(groups)]
    length = max(texts.shape[1] for _, texts, _ in parts)
    images = torch.cat([i.detach() for i, _, _ in parts]).to(device).requires_grad_()
    texts = torch.cat([F.pad(t.detach(), (0, 0, 0, length - t.shape[1])) for _, t, _ in parts]).to(device)
    texts.requires_grad_()
    padding = torch.cat([F.pad(p, (0, length - p.shape[1]), value=True) for _, _, p in parts]).to(device)
    scale, micro = torch.tensor(100.0, device=device), shapes["micro_batch"]

    def per_group(encoded):
        return torch.stack([token_term(Encoded(image_tokens=encoded.image_tokens[g * micro:(g + 1) * micro],
                                               text_tokens=encoded.text_tokens[g * micro:(g + 1) * micro],
                                               text_padding_mask=encoded.text_padding_mask[g * micro:(g + 1) * micro]),
                                       scale) for g in range(groups)])

    def grouped(encoded):
        sim_i2t, sim_t2i = grouped_token_similarities(encoded, groups)
        return torch.stack([token_loss_of_similarities(a, b, scale) for a, b in zip(sim_i2t, sim_t2i)])

    def run(function):
        images.grad = texts.grad = None
        losses = function(Encoded(image_tokens=images, text_tokens=texts, text_padding_mask=padding))
        losses.sum().backward()
        _synchronize(device)
        return losses.detach(), images.grad, texts.grad

    results, seconds, calls = {}, {"per_group": [], "grouped": []}, {}
    ways = {"per_group": per_group, "grouped": grouped}
    for name, function in ways.items():
        results[name] = run(function)   # the warm-up
        activities = [torch.profiler.ProfilerActivity.CPU] + \
            ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with torch.profiler.profile(activities=activities) as profile:
            run(function)
        events = profile.events()
        calls[name] = {"aten_ops": sum(1 for e in events if e.name.startswith("aten::")),
                       **({"cuda_kernels": sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)}
                          if device.type == "cuda" else {})}
    for _ in range(repeats):  # interleaved, so both see the same load on a shared machine
        for name, function in ways.items():
            start = time.perf_counter()
            run(function)
            seconds[name].append(time.perf_counter() - start)
    equal = {part: torch.equal(a, b) for part, a, b in
             zip(("losses", "image_grad", "text_grad"), results["per_group"], results["grouped"], strict=True)}
    return {"benchmark": "token_term_profile", "mode": "grouped", "groups": groups,
            "shapes": {**shapes, "text_tokens": length, "chunk": TOKEN_LOSS_CHUNK}, "precision": "fp32 term",
            "equal_per_group_vs_grouped": equal,
            **{name: {"s": [round(x, 4) for x in seconds[name]], "s_median": round(statistics.median(seconds[name]), 4),
                      "calls": calls[name]} for name in ways},
            **environment(device)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes instead of Long-CLIP-L's")
    parser.add_argument("--repeats", type=int, default=5, help="timed forward+backward passes of the term alone")
    parser.add_argument("--step-repeats", type=int, default=2, help="timed micro-batches per implementation")
    parser.add_argument("--step-warmup", type=int, default=1, help="untimed micro-batches first")
    parser.add_argument("--step-implementations", default=",".join(IMPLEMENTATIONS),
                        help="implementations whose micro-batch is timed; another's share is derived from the "
                             "first timed one's micro-batch less its term plus the other's term")
    parser.add_argument("--grad-checkpointing", action="store_true",
                        help="checkpoint every block of both towers in the micro-batch (a Long-CLIP-L micro-batch of "
                             "16 needs about 16 GB without); the no-grad forward is then timed too, and "
                             "term_share_without_recompute takes it out of the micro-batch")
    parser.add_argument("--term-only", action="store_true", help="skip the whole micro-batch")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--groups", type=int, default=None,
                        help="compare per-group token terms with one block-diagonal call over this many groups")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines are appended here")
    args = parser.parse_args(argv)
    shapes, device = SMALL if args.small else PAPER, torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    configure_tf32(device, True)  # the paper profile's execution.tf32
    if args.groups:
        record = grouped_record(shapes, args.groups, args.repeats, device)
        print({key: record[key] for key in ("equal_per_group_vs_grouped", "per_group", "grouped")}, flush=True)
        append_jsonl(args.out, record)
        return record
    images, texts, padding = (t.to(device).detach().requires_grad_(t.requires_grad) for t in token_features(shapes))
    reference = [previous_token_alignment_loss(images, texts, padding, 100.0, TOKEN_LOSS_CHUNK)]
    reference += list(torch.autograd.grad(reference[0], [images, texts]))
    current = [token_alignment_loss(images, texts, padding, 100.0, TOKEN_LOSS_CHUNK)]
    current += list(torch.autograd.grad(current[0], [images, texts]))
    max_difference = {name: float((a - b).detach().abs().max()) for name, a, b in
                      zip(("loss", "image_grad", "text_grad"), current, reference, strict=True)}
    record = {"benchmark": "token_term_profile", "shapes": {**shapes, "text_tokens": texts.shape[1],
                                                             "chunk": TOKEN_LOSS_CHUNK},
              "precision": "fp32 term; micro-batch " + ("bf16 autocast" if device.type == "cuda" else "fp32"),
              "max_abs_difference_current_vs_previous": max_difference, "implementations": {}}
    model = None
    if not args.term_only:
        torch.manual_seed(0)
        model = create(shapes["model"]).model.to(device).train()
        if args.grad_checkpointing:
            for module in model.modules():
                if hasattr(module, "resblocks") and hasattr(module, "grad_checkpointing"):
                    module.grad_checkpointing = True
            record["grad_checkpointing"] = True
            record["forward_no_grad_s"] = time_forward(model, shapes, device)
    stepped = [name for name in args.step_implementations.split(",") if name] if model is not None else []
    terms = {name: [] for name in IMPLEMENTATIONS}
    for _ in range(args.repeats):  # interleaved, so both see the same load on a shared machine
        for name, loss_fn in IMPLEMENTATIONS.items():
            terms[name] += time_term(loss_fn, images, texts, padding, 1)
    for name, loss_fn in IMPLEMENTATIONS.items():
        term = terms[name]
        entry = {"term_s": term, "term_s_median": statistics.median(term),
                 "saved_bytes": saved_bytes(loss_fn, images, texts, padding, 100.0, TOKEN_LOSS_CHUNK)}
        if name in stepped:
            step = time_micro_batch(model, shapes, name, args.step_repeats, device, args.step_warmup)
            entry.update({"micro_batch_s": step, "micro_batch_s_median": statistics.median(step),
                          "term_share": entry["term_s_median"] / statistics.median(step),
                          "step_warmup": args.step_warmup})
        record["implementations"][name] = entry
    if stepped:  # an implementation without its own micro-batch: the timed one's, with this term instead
        base = record["implementations"][stepped[0]]
        rest_s = base["micro_batch_s_median"] - base["term_s_median"]
        for name, entry in record["implementations"].items():
            if name not in stepped:
                entry.update({"term_share": entry["term_s_median"] / (rest_s + entry["term_s_median"]),
                              "term_share_derived_from": stepped[0]})
    if "forward_no_grad_s" in record:  # checkpointing recomputes each block's forward once in backward
        for entry in record["implementations"].values():
            if "micro_batch_s_median" in entry:
                rest_s = entry["micro_batch_s_median"] - record["forward_no_grad_s"]
            else:
                base = record["implementations"][stepped[0]]
                rest_s = base["micro_batch_s_median"] - base["term_s_median"] + entry["term_s_median"] \
                    - record["forward_no_grad_s"]
            entry["term_share_without_recompute"] = entry["term_s_median"] / rest_s
    for name, entry in record["implementations"].items():
        print(f"{name:8s} term {entry['term_s_median']:.3f} s  saved {entry['saved_bytes'] / 2**20:.0f} MiB"
              + (f"  share {entry['term_share']:.1%}" if "term_share" in entry else "")
              + (f"  micro-batch {entry['micro_batch_s_median']:.1f} s" if "micro_batch_s" in entry else ""),
              flush=True)
    record.update(environment(device))
    append_jsonl(args.out, record)
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
