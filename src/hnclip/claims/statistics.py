"""The claims.yaml statistic interpreter: a claim's statistic as draws (estimate, then bootstrap
replicates) of one number.

A statistic of one kind yields "items" (one value per cell, contrast, benchmark, epoch or run, each as
draws, see hnclip.report.effects); `difference` and `concat` combine statistics' items; `reduce` turns
the items into one (REDUCERS, with the statistic's tie `tolerance`). The kinds (STATISTIC_KINDS):
  contrast          a − b (or − the best / `b_rank`-th best of several b) per pair and column
  spread            per column, the largest minus the smallest value over the rows
  trajectory        per row and column, a TRAJECTORY_MEASURES measure over the evaluated epochs
  order_preserved   per pair of rows and column, whether a replicate keeps the reference's order
  probe             gradient-probe measures (hnclip.claims.probe_statistics)
  caption_geometry  a caption-statistics field per benchmark
  paired_timing     one row's optimizer steps over another's, timed in turn on the same batches
"""
from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np

from hnclip.claims.definitions import row_of
from hnclip.claims.evidence import paper_geometry
from hnclip.claims.probe_statistics import probe_items
from hnclip.config.registry import NOT_IMPLEMENTED
from hnclip.report.effects import CellUnavailable, Column, aligned


def statistic_columns(spec: dict) -> list[Column]:
    """A statistic's `columns`: plain cells, each benchmark's mean over both directions, or one pooled column."""
    benchmarks, directions, metrics = spec["benchmarks"], spec["directions"], spec["metrics"]
    if spec.get("pool"):
        parts = tuple(itertools.product(benchmarks, directions, metrics))
        return [Column("pooled", "both", "mean", parts)]
    if directions == "mean":
        return [Column(b, "both", m, ((b, "t2i", m), (b, "i2t", m))) for b in benchmarks for m in metrics]
    return [Column(b, d, m, ((b, d, m),)) for b in benchmarks for d in directions for m in metrics]


def _column_draws(source, table: str, row: str, column: Column, selection, missing: set) -> np.ndarray | None:
    """A row's draws of a column (the mean of its parts); None, with the row noted in `missing`, where a
    part belongs to a row not trained yet."""
    parts = []
    for part in column.parts:
        try:
            parts.append(source.cell(table, row, part, selection))
        except CellUnavailable as exc:
            if exc.status != NOT_IMPLEMENTED:
                raise
            missing.add(f"{table} {row}")
    if len(parts) != len(column.parts):
        return None
    return parts[0] if len(parts) == 1 else np.mean(np.stack(aligned(*parts)), axis=0)


def _raise_if_missing(missing: set) -> None:
    """Not implemented: the rows of `missing` are not trained by this pipeline yet."""
    if missing:
        raise CellUnavailable(NOT_IMPLEMENTED, ", ".join(sorted(missing)))


def _common_epochs(source, rows: list[tuple[str, str]], column: Column) -> list[int]:
    held = [set(source.epochs(table, row, part)) for row, table in rows for part in column.parts]
    return sorted(set.intersection(*held)) if held else []


class Items(list):
    """A leaf's items with each item's own tie tolerance (`tolerances`, None: the statistic's one)."""
    tolerances: list[float] | None = None


def _items(values: list, tolerances: list | None) -> Items:
    out = Items(values)
    out.tolerances = tolerances if tolerances is not None and len(tolerances) == len(out) else None
    return out


def _column_tolerances(spec: dict, keys: list[str]) -> list | None:
    """Each item's tie (`item_ties` of a resolved leaf, by its column's key); None where the leaf has none."""
    ties = spec.get("item_ties")
    return None if ties is None else [ties.get(key) for key in keys]


def _contrast(spec: dict, source) -> list[np.ndarray]:
    """a − b (or − the best, or the `b_rank`-th best, of several b) for each pair and column the a row
    has; with `epochs: each`, one item per epoch both sides evaluated. A resolved leaf's `item_ties`
    (hnclip.claims.tie) tag each item with its column's tie."""
    table, b_table = spec["table"], spec.get("b_table", spec["table"])
    a_selection = spec.get("a_selection", spec.get("selection"))
    b_selection = spec.get("b_selection", spec.get("selection"))
    rank = spec.get("b_rank", 1)
    items, missing, ties = Items(), set(), []
    for a, b in spec["pairs"]:
        others = [row_of(row, b_table) for row in ([b] if isinstance(b, str) else b)]
        if rank > len(others):
            raise ValueError(f"b_rank {rank} of {len(others)} rows")
        for column in statistic_columns(spec["columns"]):
            if not all(source.has(table, a, part) for part in column.parts):
                continue  # e.g. Table A9's rows each have one benchmark
            if spec.get("epochs") == "each":
                selections = [(e, e) for e in _common_epochs(source, [(a, table), *others], column)]
                if not selections:
                    raise CellUnavailable("no epoch evaluated for every row", f"{table} {a}")
            else:
                selections = [(a_selection, b_selection)]
            for sel_a, sel_b in selections:
                a_draws = _column_draws(source, table, a, column, sel_a, missing)
                b_draws = [_column_draws(source, t, row, column, sel_b, missing) for row, t in others]
                if a_draws is not None and all(d is not None for d in b_draws):
                    ties.append(spec.get("item_ties", {}).get(column.key))
                    arrays = aligned(a_draws, *b_draws)
                    if len(arrays) == 2:
                        items.append(arrays[0] - arrays[1])
                        continue
                    stacked = np.stack(arrays[1:])
                    best = stacked.max(axis=0) if rank == 1 else np.sort(stacked, axis=0)[-rank]
                    items.append(arrays[0] - best)
    _raise_if_missing(missing)
    if not items:
        raise CellUnavailable("none of the cells this claim compares", table)
    if all(t is not None for t in ties):
        items.tolerances = ties
    return items


def _spread(spec: dict, source) -> list[np.ndarray]:
    """Per column, the largest minus the smallest value over the rows."""
    items, missing = [], set()
    for column in statistic_columns(spec["columns"]):
        draws = [_column_draws(source, spec["table"], row, column, spec.get("selection"), missing)
                 for row in spec["rows"]]
        if all(d is not None for d in draws):
            stacked = np.stack(aligned(*draws))
            items.append(stacked.max(axis=0) - stacked.min(axis=0))
    _raise_if_missing(missing)
    return items


TRAJECTORY_MEASURES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    # x: [epochs, draws], epochs in order
    "max_drawdown": lambda x: (np.maximum.accumulate(x, axis=0) - x).max(axis=0),  # largest fall below a peak
    "peak_first": lambda x: x[0] - x[1:].max(axis=0),  # epoch 1 minus the best later epoch
    "first_minus_last": lambda x: x[0] - x[-1],
    "last_minus_first": lambda x: x[-1] - x[0],
}


def _trajectory(spec: dict, source) -> list[np.ndarray]:
    """Per row and column, a measure of the row's values over every evaluated epoch."""
    table, measure = spec["table"], TRAJECTORY_MEASURES[spec["measure"]]
    items, missing, keys = [], set(), []
    for row in spec["rows"]:
        for column in statistic_columns(spec["columns"]):
            epochs = _common_epochs(source, [(row, table)], column)
            if len(epochs) < 2:
                raise CellUnavailable("fewer than two evaluated epochs", f"{table} {row}")
            draws = [_column_draws(source, table, row, column, e, missing) for e in epochs]
            if all(d is not None for d in draws):
                items.append(measure(np.stack(aligned(*draws))))
                keys.append(column.key)
    _raise_if_missing(missing)
    return _items(items, _column_tolerances(spec, keys))


def _order_preserved(spec: dict, source) -> list[np.ndarray]:
    """For each pair of rows and column, the smaller of the two signed differences (reference rows and
    their replicate rows, e.g. two seeds), signed by the reference estimate's order: negative where the
    replicate swaps the pair."""
    table, reference, replicate = spec["table"], spec["reference"], spec["replicate"]
    if len(reference) != len(replicate):
        raise ValueError("order_preserved: reference and replicate name the same number of rows")
    items, missing, keys = [], set(), []
    for column in statistic_columns(spec["columns"]):
        draws = [_column_draws(source, table, row, column, spec.get("selection"), missing)
                 for row in [*reference, *replicate]]
        if any(d is None for d in draws):
            continue
        arrays = aligned(*draws)
        ref, rep = arrays[:len(reference)], arrays[len(reference):]
        blocks = getattr(source, "sims", 1)  # several simulated reproductions' draws one after another
        for i, j in itertools.combinations(range(len(reference)), 2):
            estimates = (ref[i] - ref[j]).reshape(blocks, -1)[:, :1]  # each block's estimate sets its order
            sign = np.broadcast_to(np.where(estimates >= 0, 1.0, -1.0), (blocks, len(ref[i]) // blocks)).ravel()
            items.append(np.minimum(sign * (ref[i] - ref[j]), sign * (rep[i] - rep[j])))
            keys.append(column.key)
    _raise_if_missing(missing)
    return _items(items, _column_tolerances(spec, keys))


def _caption_geometry(spec: dict, source) -> list[np.ndarray]:
    """Each benchmark's field (`versus_paper`: minus Table A1's value of it)."""
    values = [source.caption_geometry(b, spec["field"]) for b in spec["benchmarks"]]
    if spec.get("versus_paper"):
        return [v - paper_geometry(b, spec["field"]) for v, b in zip(values, spec["benchmarks"])]
    return values


def _paired_timing(spec: dict, source) -> list[np.ndarray]:
    """The median over rounds of numerator / denominator step seconds, with the median's distribution-free
    (order-statistic) interval: the runs' optimizer steps were taken on the same batches
    (hnclip.commands.step_timing)."""
    numerator, denominator = (source.step_times(spec["table"], spec[key]) for key in ("numerator", "denominator"))
    if len(numerator) != len(denominator):
        raise ValueError(f"paired timing: {len(numerator)} and {len(denominator)} rounds")
    return [median_draws(numerator / denominator, source.boot.settings.resamples)]


def median_draws(values: np.ndarray, resamples: int) -> np.ndarray:
    """[median, replicates...] of `values` (the last axis) whose percentile interval is the median's
    distribution-free (order-statistic) interval. The true median lies in gap B of the sorted values
    (between x_(B) and x_(B+1), 1-based) with B ~ Binomial(n, ½); replicate i sits in the gap at the
    ((i + ½) / resamples) quantile of B, on its outer edge (x_(B) in the lower half of the quantiles,
    x_(B+1) in the upper), so the 2.5 and 97.5 % replicates are the interval's ends: x_(6) and x_(15) of 20
    values (coverage 95.9 %)."""
    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    ordered = np.sort(values, axis=-1)
    cdf = np.cumsum([math.comb(n, k) for k in range(n + 1)]) / 2.0 ** n
    quantiles = (np.arange(resamples) + 0.5) / resamples
    gaps = np.searchsorted(cdf, quantiles)  # B_i in 0..n
    ranks = np.clip(np.where(quantiles < 0.5, gaps, gaps + 1), 1, n)
    return np.concatenate([np.median(values, axis=-1)[..., None], ordered[..., ranks - 1]], axis=-1)


# Reducers of a [items, draws] stack; `tol` is the statistic's tie tolerance (a number, or [items, 1]: each
# item's own): an item within it of 0 counts for count_positive / count_nonnegative (a tie an exact
# reproduction cannot resolve). second_smallest: "at least all but one of the items" (> 0: n − 1 of n are);
# a profile with a single item (one benchmark) has no "all but one": that item itself must hold.
REDUCERS: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "min": lambda x, tol: x.min(axis=0), "max": lambda x, tol: x.max(axis=0), "mean": lambda x, tol: x.mean(axis=0),
    "second_smallest": lambda x, tol: np.sort(x, axis=0)[min(1, len(x) - 1)],
    "abs_mean": lambda x, tol: np.abs(x).mean(axis=0), "max_abs": lambda x, tol: np.abs(x).max(axis=0),
    "count_positive": lambda x, tol: (x > -tol).sum(axis=0).astype(float),
    "count_nonnegative": lambda x, tol: (x >= -tol).sum(axis=0).astype(float),
}
# A leaf statistic's kind -> its items (spec, source) -> [items]
STATISTIC_KINDS: dict[str, Callable[[dict, object], list[np.ndarray]]] = {
    "contrast": _contrast, "spread": _spread, "probe": probe_items, "caption_geometry": _caption_geometry,
    "paired_timing": _paired_timing, "trajectory": _trajectory, "order_preserved": _order_preserved}


COUNT_REDUCERS = ("count_positive", "count_nonnegative")
OWN_TIE_REDUCERS = ("min", "max", "second_smallest")  # an item decides: it is judged against its own tie


def _tolerances_of(items: list) -> list | None:
    ties = getattr(items, "tolerances", None)
    return None if ties is None or any(t is None for t in ties) else list(ties)


def statistic_items(statistic: dict, source) -> list[np.ndarray]:
    """A statistic's items (reduced to one when it names a `reduce`), each with its own tie where its leaves
    carry them (a difference's item: the larger of its two items' ties)."""
    if "difference" in statistic:
        first, second = (statistic_items(s, source) for s in statistic["difference"])
        if len(first) != len(second) and 1 not in (len(first), len(second)):
            raise ValueError(f"difference of {len(first)} and {len(second)} items")
        n = max(len(first), len(second))  # one item against several: the one is repeated
        ties = [_tolerances_of(x) for x in (first, second)]
        ties = None if None in ties else [max(a, b) for a, b in zip(*(t * n if len(t) == 1 else t for t in ties))]
        first, second = (x * n if len(x) == 1 else x for x in (first, second))
        out = _items([np.subtract(*aligned(f, s)) for f, s in zip(first, second)], ties)
    elif "concat" in statistic:
        parts = [statistic_items(s, source) for s in statistic["concat"]]
        ties = [_tolerances_of(p) for p in parts]
        out = _items([item for p in parts for item in p], None if None in ties else [t for p in ties for t in p])
    else:
        (kind,) = [k for k in STATISTIC_KINDS if k in statistic]
        out = STATISTIC_KINDS[kind](statistic[kind], source)
    out = _against_own_ties(statistic, out)
    reduce = statistic.get("reduce")
    if reduce is None:
        return out
    if reduce == "value":
        if len(out) != 1:
            raise ValueError(f"`reduce: value` needs one item, got {len(out)}")
        return out
    tolerance = float(statistic.get("tolerance", 0.0))
    own = _tolerances_of(out)
    if own is not None and "tolerance" in statistic and reduce in COUNT_REDUCERS:
        tolerance = np.asarray(own, dtype=float)[:, None]  # each item's own tie
    return [REDUCERS[reduce](np.stack(aligned(*out)), tolerance)]


def _against_own_ties(statistic: dict, items: list) -> list:
    """A decision at the claim's tie (`-tie`, `tie`; hnclip.claims.tie.resolved marks it `item_tie_sign`) on a
    minimum or maximum (OWN_TIE_REDUCERS: one item decides) judged item by item against each item's own tie:
    every item moved by sign × (its tie − the claim's tie), so that item i against −tie (or +tie) is item i
    against its own. An item of the claim's largest tie is unchanged;
    one of a smaller tie (a larger test set, an averaged column) must clear its own, smaller tie."""
    sign, own = statistic.get("item_tie_sign"), _tolerances_of(items)
    if not sign or own is None or "tolerance" not in statistic or statistic.get("reduce") not in OWN_TIE_REDUCERS:
        return items
    claim_tie = float(statistic["tolerance"])
    return _items([item + sign * (tie - claim_tie) for item, tie in zip(items, own)], own)


def statistic_draws(statistic: dict, source) -> np.ndarray:
    """A claim's statistic: the draws of its one (reduced) item."""
    out = statistic_items(statistic, source)
    if len(out) != 1:
        raise ValueError(f"a claim's statistic must reduce to one value, got {len(out)} items (add `reduce`)")
    return out[0]


