"""Wall time of Recall@K (both directions, K = 1, 5, 10, pessimistic ties) at 5,000 x 5,000 on CPU; goal <= 1 s.

    python benchmarks/recall_large.py            # N=5000, D=768
    python benchmarks/recall_large.py --small    # N=500 (what the tests run)

Features are random and L2-normalized (fp32); the timed call is the evaluation's `recall_at_k`
on already-encoded features: the fp32 similarity matrix, then the rank of every ground truth.
One untimed warm-up call, then the median of --repeats calls.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from throughput import ROOT, append_jsonl, environment

from hnclip.evaluation.retrieval import recall_at_k

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "recall_large.jsonl"
GOAL_S = 1.0
KS = (1, 5, 10)


def random_features(n: int, dim: int, seed: int) -> torch.Tensor:
    features = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.normalize(features, dim=-1)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="N=500 instead of 5000")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="a JSON line is appended here")
    args = parser.parse_args(argv)
    n = 500 if args.small else 5000
    images, texts = random_features(n, args.dim, 0), random_features(n, args.dim, 1)
    recall_at_k(images, texts, KS)  # warm-up
    seconds = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        recall_at_k(images, texts, KS)
        seconds.append(time.perf_counter() - started)
    median = statistics.median(seconds)
    record = {"benchmark": "recall_large", "n": n, "dim": args.dim, "ks": list(KS), "tie_rule": "pessimistic",
              "median_s": median, "seconds": seconds, "goal_s": GOAL_S, "meets_goal": median <= GOAL_S,
              **environment(torch.device("cpu"))}
    append_jsonl(args.out, record)
    print(f"recall_at_k {n} x {n}, D={args.dim}: median {median:.3f} s over {args.repeats} "
          f"({'meets' if median <= GOAL_S else 'misses'} the {GOAL_S:g} s goal)", flush=True)
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
