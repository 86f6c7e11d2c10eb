"""The between-run correlation of per-query outcomes on one test set: the tie tolerance's query term
(hnclip.claims.tie) and the simulated worlds' runs (hnclip.claims.specificity) use it.

Measured from evaluation records (per-query ranks of the best epoch) where two or more runs of a test set and
direction hold them (`outcome_correlation`): the correlation phi of their R@1 hits, turned into the latent
Gaussian copula's rho at the pair's hit rate (`latent_correlation`). The paper publishes no per-query
outcomes: on its own numbers the miniature's measured median (specificity.json's settings) is the documented
fallback."""
from __future__ import annotations

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np

from hnclip.io import read_json


def hit_correlation(p: float, rho: float) -> float:
    """phi, the correlation of two Bernoulli(p) hits that are {Z_1 < h}, {Z_2 < h} for standard normals of
    correlation rho (h = Φ⁻¹(p)): (P(both) − p²) / (p(1 − p)), with P(both) − p² by Plackett's identity
    ∫_0^rho exp(−h²/(1 + r)) / (2π sqrt(1 − r²)) dr (midpoint rule after r = sin θ, smooth up to rho = 1)."""
    if not 0 < p < 1:
        return 1.0
    h = NormalDist().inv_cdf(p)
    steps = 2000
    top = math.asin(max(-1.0, min(1.0, rho)))
    width = top / steps
    covariance = float(np.exp(-h * h / (1 + np.sin((np.arange(steps) + 0.5) * width))).sum()) * width / (2 * math.pi)
    return covariance / (p * (1 - p))


def latent_correlation(phi: float, p: float) -> float:
    """The latent (Gaussian copula) correlation rho whose hits at rate p correlate phi (hit_correlation's
    inverse, by bisection)."""
    low, high = -0.999, 0.999
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if hit_correlation(p, middle) < phi else (low, middle)
    return (low + high) / 2


def outcome_correlation(evals: Path | list[Path]) -> dict:
    """The correlation between runs' per-query outcomes on one test set, from evaluation records (and the
    commits that wrote them) (a folder results/evals/<run>/<benchmark>.json, or a list of such files; their
    best epoch's per-query ranks): for every pair of runs on a test set and direction, the correlation phi of
    their R@1 hits (rank 0), turned into the Gaussian copula's rho at the pair's mean hit rate
    (`latent_correlation`); the median over all pairs, and per test set and direction (`by_test_set`, each
    with its `median` rho, its runs and pairs)."""
    by_test_set: dict[str, dict[str, np.ndarray]] = {}
    commits: set[str] = set()
    files = sorted(evals.glob("*/*.json")) if isinstance(evals, Path) else sorted(p for p in evals if p.is_file())
    for record_path in files:
        record = read_json(record_path)
        commits.add(str(record.get("provenance", {}).get("git", {}).get("commit")))
        for direction, ranks in (record.get("best", {}).get("metrics", {}).get("ranks") or {}).items():
            key = f"{record_path.stem}/{direction}"
            by_test_set.setdefault(key, {})[record_path.parent.name] = np.asarray(ranks) == 0
    per_set, every = {}, []
    for key, runs in sorted(by_test_set.items()):
        names, values = sorted(runs), []
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                x, y = runs[a], runs[b]
                if len(x) != len(y) or x.all() or y.all() or not x.any() or not y.any():
                    continue  # a constant outcome has no correlation
                values.append(latent_correlation(float(np.corrcoef(x, y)[0, 1]), float((x.mean() + y.mean()) / 2)))
        if values:
            per_set[key] = {"runs": len(names), "pairs": len(values), "median": round(float(np.median(values)), 3)}
            every += values
    if not every:
        raise ValueError(f"{evals}: no evaluation records with per-query ranks of two runs on one test set")
    return {"correlation": round(float(np.median(every)), 3), "pairs": len(every), "of": "R@1 hits",
            "by_test_set": per_set, "records_of_commits": sorted(commits)}


def test_set_correlations(evals: Path | list[Path]) -> dict[str, float]:
    """"benchmark/direction" -> the rho measured there from paired per-query hits (`outcome_correlation`);
    empty where no test set has two runs with per-query ranks."""
    try:
        measured = outcome_correlation(evals)
    except ValueError:
        return {}
    return {key: entry["median"] for key, entry in measured["by_test_set"].items()}
