"""The claims' tie tolerance, from one formula fixed before any result is read.

A rule that lets a row "lead or tie" another, or a contrast be "no worse than" zero, needs a tolerance: the
largest deficit that the measurement cannot tell from none. claims.yaml never states it as a number; it
writes `tie` (a statistic's `tolerance: tie`, a decision's `threshold: -tie`), and the rule is judged with

    tie = Z_TIE * SE,   SE = sqrt( 100^2 * 2 * p(1 - p) * (1 - rho) / n  +  2 * seed_sd^2 )   (R@1 points)

the standard error of one paired contrast of two single-seed runs on a test set of n queries: the query
term at the largest binomial variance (p = 0.5, so no result is read), with the between-run correlation of
per-query outcomes rho measured on this project's runs (specificity.json's settings), plus the
between-seed term (each run's seed moves its R@1 by seed_sd, independently). n is the smallest test set
the claim reads; seed_sd comes from a table of seed replicates (Table A8): this profile's own where built,
else the paper's. One Z_TIE for every claim.

A claim of closeness (|Δ| at most some amount, a value within reach of a magnitude the paper states) is
judged against an equivalence band of `2 * tie` (`threshold: 2 * tie`, `6.8 - 2 * tie`): a 95 % interval of
half-width tie around an estimate that is off by less than tie fits inside it, which an exact reproduction's
estimate is 95 % of the time. A band of one tie would fit only an estimate exactly on the truth. The
mean of several contrasts (k >= 4) has at most half the standard error of one: its band is one tie.
"""
from __future__ import annotations

import copy
import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

from hnclip.claims.definitions import SPECIFICITY_FILE, statistic_leaves
from hnclip.claims.evidence import paper_cells
from hnclip.config import paths
from hnclip.io import read_json
from hnclip.report.effects import Column

Z_TIE = 1.96          # a tie: within the two-sided 95 % band of a contrast that is zero in truth
CORRELATION = 0.5     # default between-run correlation of per-query outcomes on one test set (latent, Gaussian),
                      # where specificity.json records no measured one
QUERY_P = 0.5         # the largest binomial variance: the formula reads no result
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

    def standard_error(self, n: int) -> float:
        """SE (R@1 points) of a paired contrast of two single-seed runs on n queries."""
        query = 100.0 ** 2 * 2 * QUERY_P * (1 - QUERY_P) * (1 - self.correlation) / n
        return math.sqrt(query + 2 * self.seed_sd ** 2)

    def tie(self, claim: dict) -> float:
        """The claim's tie tolerance: Z_TIE times the SE on the smallest test set it reads."""
        benchmarks = claim_benchmarks(claim)
        known = [self.sizes[b] for b in benchmarks if b in self.sizes]
        if not known:
            raise ValueError(f"claim {claim['claim_id']}: no test-set size for {sorted(benchmarks) or 'its cells'}")
        return Z_TIE * self.standard_error(min(known))

    def describe(self) -> str:
        return (f"tie = {Z_TIE:g} × SE of a paired single-seed contrast (ρ {self.correlation:.3f}, seed SD "
                f"{self.seed_sd:.2f} R@1 from {self.seed_source})")


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


def resolved(claim: dict, model: TieModel) -> dict:
    """The claim with every `tie` expression replaced by its value on `model`'s profile, and `tie` (None
    where the rule has none); a claim resolved already is returned as it is."""
    if "tie" in claim:
        return claim
    return with_tie(claim, model.tie(claim) if uses_tie(claim) else None)


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


def paper_seed_sd() -> tuple[float, str]:
    cells = paper_cells(SEED_TABLE)
    pairs = _seed_pairs(lambda row, c: cells.value(row, Column(*c, parts=(c,))))
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
    return TieModel(paper_test_sizes(), correlation, sd, source)


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
    return TieModel(sizes, measured_correlation() if correlation is None else correlation, sd, source, tuple(read))
