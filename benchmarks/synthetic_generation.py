"""Speed of the procedural benchmarks (`hnclip.data.synthetic.generate_split`): scenes rendered and
captioned per second, single-threaded, for each variant.

    python benchmarks/synthetic_generation.py                  # 1,000 rows of every variant's first split
    python benchmarks/synthetic_generation.py --rows 100 --repeats 1 --variants docci

Each configuration is generated `repeats` times after one untimed warm-up; the median wall time is
reported. Generation is pure NumPy/PIL on one core, so the figure depends on the CPU and its load
(recorded with each line).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from throughput import ROOT, append_jsonl, environment

from hnclip.data.synthetic import VARIANTS, generate_split

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "synthetic_generation.jsonl"


def measure(variant: str, rows: int, image_size: int, repeats: int) -> dict:
    split = VARIANTS[variant].splits[0]
    generate_split(variant, split, min(rows, 8), seed=0, image_size=image_size)  # warm-up: imports, caches
    seconds = []
    for repeat in range(repeats):
        start = time.perf_counter()
        generate_split(variant, split, rows, seed=repeat, image_size=image_size)
        seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    return {"benchmark": "synthetic_generation", "variant": variant, "split": split, "rows": rows,
            "image_size": image_size, "repeats": repeats, "seconds_median": median,
            "seconds_all": seconds, "rows_per_s": rows / median, **environment(torch.device("cpu"))}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1000, help="rows generated per timed call")
    parser.add_argument("--image-size", type=int, default=64, help="pixels per side (the tiny profile's 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls (the median is reported)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON lines are appended here")
    args = parser.parse_args(argv)
    args.variants = args.variants.split(",")
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    torch.set_num_threads(1)  # generation does not use torch; this keeps `threads` in the record honest
    records = []
    for variant in args.variants:
        record = measure(variant, args.rows, args.image_size, args.repeats)
        append_jsonl(args.out, record)
        print(f"{variant}: {record['rows_per_s']:.0f} rows/s ({args.rows} rows in {record['seconds_median']:.2f} s)")
        records.append(record)
    return records


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
