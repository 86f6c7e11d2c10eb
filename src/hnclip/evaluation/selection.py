"""Epoch selection: which epoch of a run a table reports (`best` by the registry's
`evaluation.selection_metric`, or `last`). One concept at two layers: this is the rule; the training side,
which keeps the selected epoch's weights while a run trains, is `hnclip.training.selection`."""
from __future__ import annotations

from typing import Callable, Sequence


def mean_r1(metrics: dict) -> float:
    """Mean of text->image and image->text Recall@1 (the paper's selection criterion)."""
    return (metrics["t2i"]["R@1"] + metrics["i2t"]["R@1"]) / 2


def rsum(metrics: dict) -> float:
    """Sum of every recorded Recall@K in both directions (the usual `rsum` of retrieval papers)."""
    return sum(value for direction in ("t2i", "i2t") for value in metrics[direction].values())


SELECTION_METRICS: dict[str, Callable[[dict], float]] = {"mean_r1": mean_r1, "rsum": rsum}


def select_epochs(history: list[dict], benchmark: str, metric: str = "mean_r1") -> dict:
    """Best (highest `metric`, earliest on ties) and last epoch of one benchmark's per-epoch metrics."""
    score = SELECTION_METRICS[metric]
    scored = [(h["epoch"], h["eval"][benchmark]) for h in history if benchmark in h.get("eval", {})]
    if not scored:
        raise KeyError(f"no per-epoch evaluation of {benchmark!r} recorded in this run")
    best_epoch, best = max(scored, key=lambda item: (score(item[1]), -item[0]))
    last_epoch, last = scored[-1]
    return {"best": {"epoch": best_epoch, "metrics": best}, "last": {"epoch": last_epoch, "metrics": last},
            "metric": metric, "per_epoch": [{"epoch": e, "metrics": m} for e, m in scored]}


def own_benchmark(in_domain: Sequence[str]) -> str | None:
    """The benchmark a run's shipped checkpoint is selected on (by `select_epochs`), which its
    transfer cells use: the first of its in-domain benchmarks in params.yaml's order (DCI, not
    Long-DCI, for a DCI run); None for a run evaluated on none."""
    return in_domain[0] if in_domain else None
