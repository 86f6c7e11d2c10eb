"""The claims' tie tolerance, from one formula fixed before any result is read.

A rule that lets a row "lead or tie" another, or a contrast be "no worse than" zero, needs a tolerance: the
largest deficit that the measurement cannot tell from none. claims.yaml never states it as a number; it
writes `tie` (a statistic's `tolerance: tie`, a decision's `threshold: -tie`), and the rule is judged with

    tie = Z_TIE * SE,   SE = sqrt( sum_parts 100^2 * 2 p(1 - p)(1 - phi) / n  /  k^2  +  2 * seed_sd^2 )   (R@1 points)

the standard error of one paired contrast of two single-seed runs on a column of k cells (one cell, a
benchmark's mean over both directions, a pooled Avg): each cell's query term is the variance of a paired
difference of two runs' per-query R@1 hits, 2 p(1 − p)(1 − phi) / n, with p the hit rate (the paper's
printed value of the compared cells, so no result of a reproduction is read; 0.5 where it prints none) and
phi the correlation of the two runs' hits, which follows from the latent (Gaussian copula) correlation rho
of their per-query outcomes at that p (`hit_correlation`; at p = 0.5, phi = (2/π)·arcsin(rho)). The
between-seed term is one seed effect per run, shared by all its cells (a column's mean keeps it whole).
n is each cell's own test set. rho is measured on this project's runs (specificity.json's settings);
seed_sd comes from a table of seed replicates (Table A8): this profile's own where built, else the paper's.

Ties are per item: the items of a contrast, trajectory or order check each get the tie of their own column
(`column_ties`, written into the leaf as `item_ties`): the count reducers count each item against its own
tie, and a decision at the claim's tie (`> -tie`, `<= tie`: `item_tie_sign`) judges each item against its
own (hnclip.claims.statistics); a claim's one `tie` (its other thresholds, the scorecard's tolerance column)
is the largest of its columns' ties. One Z_TIE for every claim.

A claim of closeness (|Δ| at most some amount, a value within reach of a magnitude the paper states) is
judged against an equivalence band of `2 * tie` (`threshold: 2 * tie`, `6.8 - 2 * tie`): a 95 % interval of
half-width tie around an estimate that is off by less than tie fits inside it, which an exact reproduction's
estimate is 95 % of the time.
"""
from __future__ import annotations

import copy
import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

from hnclip.claims.correlation import hit_correlation, test_set_correlations
from hnclip.claims.definitions import SPECIFICITY_FILE, row_of, statistic_leaves
from hnclip.claims.evidence import paper_cells
from hnclip.claims.statistics import statistic_columns
from hnclip.config import paths
from hnclip.io import read_json
from hnclip.report.effects import Column

Z_TIE = 1.96          # a tie: within the two-sided 95 % band of a contrast that is zero in truth
CORRELATION = 0.5     # default between-run correlation of per-query outcomes on one test set (latent, Gaussian),
                      # where specificity.json records no measured one
QUERY_P = 0.5         # a hit rate where the paper prints none for the compared cells (the largest variance)
SEED_TABLE = "tableA8"
SEED_COLUMNS = [("long_dci", "t2i", "R@1"), ("long_dci", "i2t", "R@1")]
_EXPRESSION = re.compile(r"^\s*(?:(?P<number>[+-]?\d+(?:\.\d*)?)\s*(?P<sign>[+-])|(?P<neg>-)?)\s*"
                         r"(?:(?P<times>\d+(?:\.\d*)?)\s*\*\s*)?tie\s*$")


@dataclass(frozen=True)
class TieModel:
    """What the formula needs on one profile: test-set sizes, the between-run correlation, the seed SD."""
    sizes: dict[str, int]
    correlation: float
    seed_sd: float
    seed_source: str
    read: tuple[str, ...] = ()    # the files the sizes and the seed SD came from (lineage)
    seed_pairs: int = 0           # the seed pairs seed_sd comes from: its uncertainty (0: taken as exact)
    # ("benchmark/direction", rho) measured from this profile's paired per-query hits; `correlation` (the
    # documented fallback) elsewhere
    measured: tuple[tuple[str, float], ...] = ()

    def correlation_of(self, benchmark: str, direction: str | None = None) -> tuple[float, str]:
        """(rho, "measured" or "fallback") of a contrast's cell on a test set and direction."""
        rho = dict(self.measured).get(f"{benchmark}/{direction}")
        return (rho, "measured") if rho is not None else (self.correlation, "fallback")

    def correlations(self, spec: dict) -> dict[str, dict]:
        """"benchmark/direction" -> {rho, source} of every cell a leaf compares (what each contrast used)."""
        return {f"{part[0]}/{part[1]}": dict(zip(("rho", "source"), self.correlation_of(part[0], part[1])))
                for column in statistic_columns(spec["columns"]) for part in column.parts}

    def seed_sd_interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """The chi-square interval of the seed SD from `seed_pairs` pairs (each pair's difference / √2 one
        degree of freedom); (seed_sd, seed_sd) where it is taken as exact."""
        if self.seed_pairs < 1:
            return self.seed_sd, self.seed_sd
        low, high = _chi2_quantile(self.seed_pairs, (1 + confidence) / 2), _chi2_quantile(self.seed_pairs,
                                                                                         (1 - confidence) / 2)
        return self.seed_sd * math.sqrt(self.seed_pairs / low), self.seed_sd * math.sqrt(self.seed_pairs / high)

    def query_variance(self, n: int, p: float = QUERY_P, rho: float | None = None) -> float:
        """Variance (R@1 points²) of the paired difference of two runs' hit rates on n queries at hit rate p
        (latent correlation rho; default the model's)."""
        return 100.0 ** 2 * paired_hit_variance(p, self.correlation if rho is None else rho) / n

    def standard_error(self, n: int, p: float = QUERY_P) -> float:
        """SE (R@1 points) of a paired contrast of two single-seed runs on one cell of n queries at hit rate p."""
        return math.sqrt(self.query_variance(n, p) + 2 * self.seed_sd ** 2)

    def column_standard_error(self, cells: list[tuple]) -> float:
        """SE of a paired contrast on a column, the mean of `cells` ((benchmark, p) or (benchmark, p,
        direction) each, on its own test set, independent query sets; a cell's rho is its test set and
        direction's where measured); the seed term is the run's, shared by the column's cells."""
        k = len(cells)
        query = 0.0
        for benchmark, p, *direction in cells:
            rho, _ = self.correlation_of(benchmark, direction[0] if direction else None)
            query += self.query_variance(self._size(benchmark), p, rho)
        query /= k ** 2
        return math.sqrt(query + 2 * self.seed_sd ** 2)

    def _size(self, benchmark: str) -> int:
        if benchmark not in self.sizes:
            raise ValueError(f"no test-set size for {benchmark!r}")
        return self.sizes[benchmark]

    def column_ties(self, spec: dict, z: float = Z_TIE) -> dict[str, float]:
        """A contrast leaf's tie per column (its key), each from its own cells' test sets and hit rates."""
        return {column.key: z * self.column_standard_error(
                    [(part[0], leaf_hit_rate(spec, part), part[1]) for part in column.parts])
                for column in statistic_columns(spec["columns"])}

    def tie(self, claim: dict, z: float = Z_TIE) -> float:
        """The claim's tie tolerance: the largest of its columns' ties (a single column's own)."""
        ties = [t for leaf in statistic_leaves(claim["statistic"]) for spec in leaf.values()
                if isinstance(spec, dict) and "columns" in spec
                for t in self.column_ties(spec, z).values()]
        if not ties:
            benchmarks = claim_benchmarks(claim)
            raise ValueError(f"claim {claim['claim_id']}: no test-set size for {sorted(benchmarks) or 'its cells'}")
        return max(ties)

    def describe(self) -> str:
        rho = (f"ρ measured from paired per-query hits on {', '.join(f'{k} {v:.3f}' for k, v in self.measured)}, "
               f"elsewhere the fallback {self.correlation:.3f}" if self.measured else f"ρ {self.correlation:.3f}")
        return (f"tie = {Z_TIE:g} × SE of a paired single-seed contrast ({rho}, seed SD "
                f"{self.seed_sd:.2f} R@1 from {self.seed_source})")


def paired_hit_variance(p: float, rho: float) -> float:
    """Var(X − Y) of two Bernoulli(p) hits whose latent Gaussian outcomes correlate rho: 2 p(1 − p)(1 − phi)."""
    return 2 * p * (1 - p) * (1 - hit_correlation(p, rho))


def leaf_hit_rate(spec: dict, part: tuple[str, str, str]) -> float:
    """The hit rate of a contrast's cell: the mean of the paper's printed values of the rows it compares
    (QUERY_P where it prints none); a leaf without rows (a trajectory's, a spread's rows are `rows`)."""
    values = []
    for table, row in _leaf_rows(spec):
        try:
            value = paper_cells(table).value(row, Column(*part, parts=(part,)))
        except Exception:  # a row or table the paper does not print (a check of ours)
            continue
        if value is not None and not math.isnan(value):
            values.append(value / 100.0)
    return min(max(sum(values) / len(values), 0.001), 0.999) if values else QUERY_P


def _leaf_rows(spec: dict) -> list[tuple[str, str]]:
    table, b_table = spec.get("table"), spec.get("b_table", spec.get("table"))
    rows = [(table, r) for r in spec.get("rows", [])]
    rows += [(table, r) for r in [*spec.get("reference", []), *spec.get("replicate", [])]]
    for a, bs in spec.get("pairs", []):
        rows.append((table, a))
        for b in ([bs] if isinstance(bs, str) else bs):
            row, other = row_of(b, b_table)
            rows.append((other, row))
    return rows


def _chi2_quantile(df: int, q: float, draws: int = 200_000) -> float:
    """A chi-square quantile (df degrees of freedom), by simulation with a fixed seed (no scipy here)."""
    import numpy as np
    return float(np.quantile(np.random.default_rng(0).chisquare(df, draws), q))


def claim_correlations(claim: dict, model: TieModel) -> dict[str, dict]:
    """"benchmark/direction" -> {rho, source} of every cell the claim's leaves compare: the rho its tie used,
    measured from paired per-query hits or the fallback."""
    out = {}
    for leaf in statistic_leaves(claim["statistic"]):
        for spec in leaf.values():
            if isinstance(spec, dict) and "columns" in spec:
                out.update(model.correlations(spec))
    return dict(sorted(out.items()))


def claim_benchmarks(claim: dict) -> set[str]:
    """The benchmarks whose cells a claim's statistic reads."""
    out = set()
    for leaf in statistic_leaves(claim["statistic"]):
        for spec in leaf.values():
            if isinstance(spec, dict) and "columns" in spec:
                out |= set(spec["columns"]["benchmarks"])
    return out


def uses_tie(claim: dict) -> bool:
    return "tie" in repr({k: claim.get(k) for k in ("statistic", "decision", "real_data_decision")})


def _value(text, tie: float):
    if not isinstance(text, str):
        return text
    match = _EXPRESSION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is neither a number nor a tie expression (tie, -tie, 2 * tie, <number> ± tie, "
                         "<number> ± 2 * tie)")
    width = tie * (float(match["times"]) if match["times"] else 1.0)
    if match["number"] is not None:
        return float(match["number"]) + (width if match["sign"] == "+" else -width)
    return -width if match["neg"] else width


def resolved(claim: dict, model: TieModel, z: float = Z_TIE) -> dict:
    """The claim with every `tie` expression replaced by its value on `model`'s profile, and `tie` (None
    where the rule has none); a statistic's `tolerance: tie` also puts each contrast leaf's ties per column
    (`item_ties`, hnclip.claims.statistics applies them item by item). A claim resolved already is returned
    as it is; `z`: the ties' multiple of the standard error (Z_TIE; the paper's borderline check moves it)."""
    if "tie" in claim:
        return claim
    out = with_tie(claim, model.tie(claim, z) if uses_tie(claim) else None)
    if out["tie"] is not None:
        _put_item_ties(out["statistic"], claim["statistic"], model, z)
        sign = item_tie_sign(claim)
        if sign and claim["statistic"].get("tolerance") == "tie":
            out["statistic"]["item_tie_sign"] = sign
    return out


TIED_LEAVES = ("contrast", "trajectory", "order_preserved")   # leaves whose items are columns of R@1 cells


def item_tie_sign(claim: dict) -> int | None:
    """+1 where every decision is "above −tie" (`> -tie`, `>= -tie`), −1 where "below tie" (`< tie`, `<= tie`):
    a decision at the claim's tie, which hnclip.claims.statistics then judges item by item against each item's
    own tie; None for any other decision (a count, a magnitude ± tie, a band)."""
    signs = set()
    for key in ("decision", "real_data_decision"):
        decision = claim.get(key)
        if decision is None:
            continue
        threshold = str(decision.get("threshold", "")).replace(" ", "")
        signs.add(+1 if decision["op"] in (">", ">=") and threshold == "-tie" else
                  -1 if decision["op"] in ("<", "<=") and threshold == "tie" else None)
    return signs.pop() if len(signs) == 1 else None


def _put_item_ties(statistic: dict, symbolic: dict, model: TieModel, z: float, inherited: bool = False) -> None:
    """Each leaf of R@1 columns (TIED_LEAVES) under a statistic whose `tolerance` is `tie` (directly, or within
    its `difference` / `concat`) gets its ties per column."""
    tied = inherited or symbolic.get("tolerance") == "tie"
    for composite in ("difference", "concat"):
        for sub, sub_symbolic in zip(statistic.get(composite, []), symbolic.get(composite, [])):
            _put_item_ties(sub, sub_symbolic, model, z, tied)
    for kind in TIED_LEAVES:
        if tied and kind in statistic:
            statistic[kind]["item_ties"] = model.column_ties(statistic[kind], z)


def with_tie(claim: dict, tie: float | None) -> dict:
    """The claim with its `tie` expressions evaluated at the value `tie`."""
    out = copy.deepcopy(claim)

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("tolerance", "threshold", "low", "high") and isinstance(value, str):
                    node[key] = _value(value, tie)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)
    if tie is not None:
        for key in ("statistic", "decision", "real_data_decision"):
            if key in out:
                walk(out[key])
    out["tie"] = tie
    return out


# ---- the seed term: a table of seed replicates ----------------------------------------------------------
def seed_variance(pairs: list[tuple[float, float]]) -> float:
    """The between-seed variance of one run's R@1 from pairs of seeds of the same cell: E[(a − b)^2] / 2."""
    if not pairs:
        raise ValueError("no pairs of seeds")
    return sum((a - b) ** 2 for a, b in pairs) / (2 * len(pairs))


def _seed_pairs(value) -> list[tuple[float, float]]:
    """Pairs (seed 42, seed 43) of every method and R@1 column of a Table A8 (`value(row, column)`)."""
    pairs = []
    for method in ("hn_clip", "goal", "structxlip"):
        for column in SEED_COLUMNS:
            a, b = value(f"{method}/seed=42", column), value(f"{method}/seed=43", column)
            if a is not None and b is not None and not (math.isnan(a) or math.isnan(b)):
                pairs.append((a, b))
    return pairs


def paper_seed_pairs() -> list[tuple[float, float]]:
    cells = paper_cells(SEED_TABLE)
    return _seed_pairs(lambda row, c: cells.value(row, Column(*c, parts=(c,))))


def paper_seed_sd() -> tuple[float, str]:
    pairs = paper_seed_pairs()
    return math.sqrt(seed_variance(pairs)), f"the paper's Table A8 ({len(pairs)} R@1 pairs of seeds 42/43)"


def table_seed_sd(csv: Path) -> tuple[float, str] | None:
    """The seed SD of a built Table A8 (its CSV), None where it holds no complete pair."""
    import pandas as pd
    frame = pd.read_csv(csv)
    if "status" in frame:
        frame = frame[frame["status"] == "ok"]
    column = "ours_mean" if "ours_mean" in frame else "ours"
    if not {"row", "benchmark", "direction", "metric", column} <= set(frame.columns):
        return None  # not a table of reproduced cells (e.g. a stub of another format)
    values = {(row, (bench, direction, metric)): float(value) for row, bench, direction, metric, value
              in frame[["row", "benchmark", "direction", "metric", column]].itertuples(index=False)}
    pairs = _seed_pairs(lambda row, c: values.get((row, c)))
    if not pairs:
        return None
    return math.sqrt(seed_variance(pairs)), f"this profile's Table A8 ({len(pairs)} R@1 pairs of seeds 42/43, {csv})"


def paper_test_sizes() -> dict[str, int]:
    """Each benchmark's test-set size (Table A1's #test)."""
    a1 = paper_cells("tableA1")
    return {b: int(a1.value(b, Column(b, "none", "n_test", ()))) for b in ("docci", "dci", "long_dci", "urban1k")}


@functools.lru_cache(maxsize=None)
def paper_model(correlation: float) -> TieModel:
    """The formula at the paper's test sizes (Table A1) with the paper's seed spread."""
    sd, source = paper_seed_sd()
    return TieModel(paper_test_sizes(), correlation, sd, source, seed_pairs=len(paper_seed_pairs()))


def measured_correlation() -> float:
    """The between-run correlation recorded beside the rules (specificity.json), else the default."""
    if SPECIFICITY_FILE.is_file():
        return float(read_json(SPECIFICITY_FILE)["settings"]["correlation"])
    return CORRELATION


def profile_model(reg, correlation: float | None = None) -> TieModel:
    """The formula on a profile: its test sets' sizes (the zero-shot evaluations' query counts; the paper's
    Table A1 where not evaluated yet) and the seed SD of its own Table A8 where built, else the paper's."""
    sizes, read = dict(paper_model(0.0).sizes), []
    for bench in reg.params["benchmarks"]:
        path = paths.evaluation(reg.zeroshot_id(), bench)
        if path.is_file():
            sizes[bench] = int(read_json(path)["best"]["metrics"]["n"])
            read.append(str(path))
    own = paths.table(SEED_TABLE, "csv")
    measured = table_seed_sd(own) if SEED_TABLE in reg.tables and own.is_file() else None
    read += [str(own)] if measured else []
    sd, source = measured or paper_seed_sd()
    # rho per test set and direction from the paired per-query hits of this profile's runs, where two hold them;
    # the recorded one (specificity.json, the miniature's) is the fallback
    evals = [paths.evaluation(run, bench) for run, bench in reg.evaluations()]
    rhos = tuple(sorted(test_set_correlations(evals).items()))
    return TieModel(sizes, measured_correlation() if correlation is None else correlation, sd, source, tuple(read),
                    measured=rhos)
