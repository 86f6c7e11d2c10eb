"""Bootstrap intervals of retrieval results: over test queries, and over seeds where there are several.

A reproduced cell (one row, benchmark, direction, Recall@K) is the mean over its seeds of the share of
test queries whose ground truth ranks within K. Its interval resamples the test queries with
replacement (and, with several seeds, the seeds too) and takes the percentiles of the resampled values.

Pairing is by construction: the query resample of a test set is drawn from a generator seeded by
(settings seed, test-set name), so every cell on the same test set (every run, both directions,
selected or last epoch) is resampled with the same query indices, and every cell with the same seeds
with the same seed draws. A contrast between two runs evaluated on the same queries is therefore a
paired bootstrap, and any statistic of several cells (a difference, a mean, a max over baselines, a
count of wins) is computed replicate by replicate from the cells' replicates. The same holds for
other per-item measurements (gradient-probe records): `Bootstrap.resample` draws their indices.

The percentile bootstrap is implemented with numpy (scipy is not in requirements.lock); it is
seeded, and its settings come from params.yaml's `bootstrap` section (defaults below).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

DEFAULTS = {"resamples": 1000, "seed": 0, "confidence": 0.95}


@dataclass(frozen=True)
class BootstrapSettings:
    resamples: int = DEFAULTS["resamples"]
    seed: int = DEFAULTS["seed"]
    confidence: float = DEFAULTS["confidence"]

    @classmethod
    def from_params(cls, params: dict) -> "BootstrapSettings":
        """params.yaml's `bootstrap: {resamples, seed, confidence}`; the defaults where it is absent."""
        return cls(**{**DEFAULTS, **(params.get("bootstrap") or {})})


@dataclass(frozen=True)
class QueryOutcomes:
    """Per-query outcomes of one cell: hits[s, q] is 1 when query q's ground truth ranks within K
    under seed s. `test_set` names the queries (cells on the same test set are paired)."""
    hits: np.ndarray
    test_set: str
    seeds: tuple[int, ...]

    @property
    def value(self) -> float:
        """The cell's value in percent: mean over seeds of the share of hits."""
        return float(self.hits.mean() * 100)


def hits_from_ranks(ranks: Sequence[int], k: int) -> np.ndarray:
    """1 where a query's 0-based ground-truth rank is within the top k."""
    return (np.asarray(ranks) < k).astype(np.float64)


def outcomes(ranks_per_seed: Sequence[Sequence[int]], k: int, test_set: str,
             seeds: Sequence[int]) -> QueryOutcomes:
    """One cell's outcomes from the ranks its evaluation records hold (one list per seed)."""
    lengths = {len(r) for r in ranks_per_seed}
    if len(lengths) != 1:
        raise ValueError(f"{test_set}: seeds were evaluated on different numbers of queries {sorted(lengths)}")
    return QueryOutcomes(np.stack([hits_from_ranks(r, k) for r in ranks_per_seed]), test_set, tuple(seeds))


def _stream(*key: int | str) -> np.random.Generator:
    """A generator that depends on the key only, never on what else was drawn before."""
    return np.random.default_rng([k if isinstance(k, int) else zlib.crc32(k.encode()) for k in key])


@dataclass
class Bootstrap:
    settings: BootstrapSettings = field(default_factory=BootstrapSettings)
    _indices: dict = field(default_factory=dict, repr=False)
    _seeds: dict = field(default_factory=dict, repr=False)
    _weights: dict = field(default_factory=dict, repr=False)

    def resample(self, unit: str, n: int) -> np.ndarray:
        """[resamples, n] indices into the n items of `unit` (a test set, a run's probe records)."""
        if (unit, n) not in self._indices:
            rng = _stream(self.settings.seed, "items", unit, n)
            self._indices[unit, n] = rng.integers(0, n, size=(self.settings.resamples, n))
        return self._indices[unit, n]

    def _seed_draws(self, seeds: tuple[int, ...]) -> np.ndarray:
        """[resamples, len(seeds)] positions into the seeds, drawn with replacement."""
        if seeds not in self._seeds:
            rng = _stream(self.settings.seed, "seeds", ",".join(map(str, seeds)))
            self._seeds[seeds] = rng.integers(0, len(seeds), size=(self.settings.resamples, len(seeds)))
        return self._seeds[seeds]

    def counts(self, unit: str, n: int) -> np.ndarray:
        """[resamples, n] how often each item is drawn (float32 holds these integers exactly)."""
        if (unit, n) not in self._weights:
            index = self.resample(unit, n)
            flat = (index + n * np.arange(index.shape[0])[:, None]).ravel()
            self._weights[unit, n] = np.bincount(flat, minlength=index.size).reshape(index.shape).astype(np.float32)
        return self._weights[unit, n]

    def replicates(self, cell: QueryOutcomes) -> np.ndarray:
        """[resamples] bootstrap values (percent) of one cell: queries resampled, and seeds too when
        there are several (a seed's value is its recall on the resampled queries)."""
        n_seeds, n = cell.hits.shape
        hits_drawn = self.counts(cell.test_set, n) @ cell.hits.T.astype(np.float32)  # exact: integers < 2**24
        per_seed = hits_drawn.astype(np.float64) * (100 / n)
        if n_seeds == 1:
            return per_seed[:, 0]
        draws = self._seed_draws(cell.seeds)
        return np.take_along_axis(per_seed, draws, axis=1).mean(axis=1)

    def seed_jitter(self, key: str, sd: float) -> np.ndarray:
        """[resamples] draws of N(0, sd²) for the cell of one run `key`: the between-seed term added to the
        replicates of a single-seed cell (the same for every cell of the run, so a run's epochs and ranks
        stay paired with each other)."""
        return _stream(self.settings.seed, "seed-term", key).normal(0.0, sd, self.settings.resamples)

    def interval(self, replicates: np.ndarray) -> tuple[float, float]:
        """Percentile interval of a statistic's replicates at the settings' confidence."""
        tail = (1 - self.settings.confidence) / 2
        low, high = np.quantile(np.asarray(replicates, dtype=float), [tail, 1 - tail], method="nearest")
        return float(low), float(high)


def recall_interval(ranks: Sequence[int], k: int, settings: BootstrapSettings = BootstrapSettings(),
                    test_set: str = "test") -> tuple[float, float, float]:
    """(Recall@k in percent, interval low, interval high) of one run over its test queries."""
    boot = Bootstrap(settings)
    cell = outcomes([ranks], k, test_set, (0,))
    return (cell.value, *boot.interval(boot.replicates(cell)))


def paired_contrast_interval(ranks_a: Sequence[int], ranks_b: Sequence[int], k: int,
                             settings: BootstrapSettings = BootstrapSettings(),
                             test_set: str = "test") -> tuple[float, float, float]:
    """(Recall@k of run a − run b, interval low, high): both runs resampled on the same queries."""
    if len(ranks_a) != len(ranks_b):
        raise ValueError(f"a paired contrast needs the same queries: {len(ranks_a)} vs {len(ranks_b)} ranks")
    boot = Bootstrap(settings)
    a, b = (outcomes([r], k, test_set, (0,)) for r in (ranks_a, ranks_b))
    return (a.value - b.value, *boot.interval(boot.replicates(a) - boot.replicates(b)))
