"""Training throughput of one optimizer step, `accumulate` vs `compute_batch` mode: images/s and peak memory.

    python benchmarks/throughput.py            # paper shapes, on cuda if present (bf16 autocast there)
    python benchmarks/throughput.py --small    # CPU-feasible shapes (what the tests run)

Paper shapes: random-initialised ViT-L-14-quickgelu at context 248 (no download), 224 px images,
random captions of 150 +- 30 tokens, micro-batch 16 x 8 accumulation = 128 pairs per optimizer
step, AdamW (lr 2e-6, weight decay 0.01). `accumulate` runs the 8 micro-batches one forward and
backward each (the training loop's default); `compute_batch` encodes 128 pairs per forward and
computes the same 16-way terms per micro-batch (`hnclip.training.compute_batch`), halving the
compute batch if it runs out of memory (the record says which value ran). Inputs are generated on
the device once, so the figure is the model step alone, without data loading.

Each (method, mode) gets a fresh model and optimizer, runs --warmup steps, then --steps timed
steps (synchronised); img_per_s = pairs per step / median step time. Peak memory is
torch.cuda.max_memory_allocated over the timed steps on cuda; on CPU it is the process's maxrss,
which only grows (so it is an upper bound for later measurements of one invocation). One JSON line
per measurement is appended to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from hnclip.config import objective_keys
from hnclip.losses.objective import loss_terms
from hnclip.models.factory import create
from hnclip.models.towers import PAD_ID
from hnclip.provenance import git_state, library_versions
from hnclip.training.compute_batch import compute_batch_backward
from hnclip.training.frameworks import TrainedModel
from hnclip.training.memory import fit_compute_batch

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "throughput.jsonl"
SOT, EOT, CONTEXT = 49406, 49407, 248
LR, WEIGHT_DECAY = 2e-6, 0.01
MODES = ("accumulate", "compute_batch")
PLAIN = {"gamma": 0.0, "lambda_tok": 0.0, "g_source": "live"}
HN_CLIP = {"gamma": 0.5, "lambda_tok": 1.0, "g_source": "live"}
# method -> (framework, objective); LoRA/DoRA are the paper's adapter baselines (InfoNCE, r 16, alpha 32)
METHODS = {"plain": ("full", PLAIN), "hnclip": ("full", HN_CLIP), "lora": ("lora", PLAIN), "dora": ("dora", PLAIN)}


@dataclass(frozen=True)
class Shapes:
    model: str
    image_size: int
    caption_tokens: int      # mean caption length; lengths are uniform in +- 20 %
    micro_batch: int
    grad_accum: int
    compute_batch: int       # requested pairs per forward in compute_batch mode

    @property
    def pairs(self) -> int:
        return self.micro_batch * self.grad_accum


PAPER = Shapes("ViT-L-14-quickgelu", 224, 150, 16, 8, 128)
SMALL = Shapes("hnclip-tiny", 64, 20, 4, 2, 8)


def random_inputs(shapes: Shapes, device: torch.device, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One accumulation group of random images and captions (SOT, random word ids, EOT, padding)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(shapes.pairs, 3, shapes.image_size, shapes.image_size, generator=generator)
    low, high = round(0.8 * shapes.caption_tokens), min(CONTEXT, round(1.2 * shapes.caption_tokens))
    tokens = torch.full((shapes.pairs, CONTEXT), PAD_ID, dtype=torch.long)
    for row, length in enumerate(torch.randint(low, high + 1, (shapes.pairs,), generator=generator).tolist()):
        tokens[row, 0], tokens[row, length - 1] = SOT, EOT
        tokens[row, 1:length - 1] = torch.randint(1, SOT, (length - 2,), generator=generator)
    pairs = zip(images.split(shapes.micro_batch), tokens.split(shapes.micro_batch))
    return [(images.to(device), tokens.to(device)) for images, tokens in pairs]


def accumulate_backward(model, batches, objective, frozen_text, autocast, check) -> list[dict]:
    """The training loop's default mode: one forward and backward per micro-batch."""
    records = []
    for images, tokens in batches:
        terms = loss_terms(model, images, tokens, objective, frozen_text, autocast)
        values = {name: float(value.detach()) for name, value in terms.items()}
        check(values)
        (terms["total"] / len(batches)).backward()
        records.append(values)
    return records


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _autocast(device: torch.device):
    if device.type == "cuda":
        return functools.partial(torch.autocast, device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def _peak_memory_gb(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9, "torch.cuda.max_memory_allocated (timed steps)"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9, "maxrss (whole process so far)"


def measure(method: str, mode: str, shapes: Shapes, device: torch.device, steps: int, warmup: int,
            log=print) -> dict:
    """Time `steps` optimizer steps of one method in one mode; returns the measurement's fields."""
    framework, objective = METHODS[method]
    torch.manual_seed(0)
    model = TrainedModel.build(create(shapes.model).model.to(device).train(), framework).module
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR,
                                  weight_decay=WEIGHT_DECAY)
    batches, autocast = random_inputs(shapes, device), _autocast(device)

    def step(compute_batch: int) -> None:
        optimizer.zero_grad(set_to_none=True)
        if mode == "accumulate":
            accumulate_backward(model, batches, objective, None, autocast, lambda _: None)
        else:
            compute_batch_backward(model, batches, objective, None, autocast, lambda _: None, compute_batch,
                                   shapes.micro_batch)
        optimizer.step()
        _synchronize(device)

    compute_batch = shapes.micro_batch
    if mode == "compute_batch":  # the fitting step is the first warm-up step
        compute_batch = fit_compute_batch(step, shapes.compute_batch, shapes.micro_batch, log)
    for _ in range(warmup):
        step(compute_batch)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(compute_batch)
        times.append(time.perf_counter() - start)
    peak, source = _peak_memory_gb(device)
    median = statistics.median(times)
    # the objective as a run's records state it: every key, by its identity name (`margin`: the G source)
    return {"mode": mode, "method": method, "framework": framework,
            "objective": objective_keys.record({**objective, "framework": framework}),
            "img_per_s": shapes.pairs / median, "step_s_median": median, "step_s": times,
            "peak_mem_gb": peak, "peak_mem_source": source,
            "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
            "shapes": {**asdict(shapes), "compute_batch": compute_batch if mode == "compute_batch" else None,
                       "requested_compute_batch": shapes.compute_batch if mode == "compute_batch" else None,
                       "context_length": CONTEXT},
            "steps": steps, "warmup": warmup}


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    models = [line.split(":", 1)[1].strip() for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
              if line.startswith("model name")]
    return models[0] if models else platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    """Where and with what a measurement ran."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    libraries = {**library_versions(), "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    return {"device": str(device), "device_name": name, "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "load_average_1min": os.getloadavg()[0],  # other work on the machine slows CPU figures
            "libraries": libraries, "git": git_state(ROOT),
            "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def append_jsonl(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help=f"CPU-feasible shapes {SMALL} instead of {PAPER}")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps (the median is reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines are appended here")
    args = parser.parse_args(argv)
    for value, known in ((args.methods, METHODS), (args.modes, MODES)):
        unknown = set(value.split(",")) - set(known)
        if unknown:
            parser.error(f"unknown {sorted(unknown)}; expected some of {list(known)}")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    shapes, device = SMALL if args.small else PAPER, torch.device(args.device)
    records = []
    for method in args.methods.split(","):
        for mode in args.modes.split(","):
            record = {"benchmark": "throughput", **measure(method, mode, shapes, device, args.steps, args.warmup),
                      **environment(device)}
            append_jsonl(args.out, record)
            print(f"{method:7s} {mode:13s} {record['img_per_s']:9.1f} img/s  peak {record['peak_mem_gb']:.2f} GB  "
                  f"compute_batch {record['shapes']['compute_batch']}", flush=True)
            records.append(record)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return records


if __name__ == "__main__":
    main(sys.argv[1:])
