"""Specificity of the claims' decision rules: would a rule also say "supported" when the claimed effect
is absent?

`hnclip.claims.calibration` asks whether an exact reproduction of the paper passes a rule (its `size`
here). This module asks the other side, in two more simulated worlds at the same test sizes:

* **null**: the rows a claim compares are made equal in truth. A contrast's a row takes the truth of its
  b side (the best of several b rows, or the `b_rank`-th best; at the b side's selected epoch), a
  spread's rows take its first row's, a trajectory's row is flat at its best value, an order check's
  rows all take the first reference row's. Every leaf of a `difference` or `concat` is made null.
* **reversed**: the null world, with the first contrast's a rows moved `SHIFT` R@1 points against the
  claim's direction (below the b side for a claim that a row is higher, above it for one that it is
  lower).

`null_support` and `reversed_support` are the shares of simulated reproductions that the rule calls
supported there. Simulated: the claims whose statistic reads retrieval cells (contrasts, spreads,
trajectories, order checks) and states a direction (a decision `>`, `>=`, `<` or `<=` on a signed
reducer), and the paired timing claims (`TimingWorld`: null, the true ratio of step times on the decision's
threshold; reversed, TIMING_SHIFT times beyond it). A closeness claim on retrieval cells (a band,
"between", or a bound on `abs_mean` / `max_abs`: the claimed effect *is* a small difference) has the
equivalence test's worlds (`closeness_worlds`): null, its statistic's truth on an edge of the band (every
compared a row at its b row plus the bound, or shifted so the paper's number lands on the band's edge);
reversed, SHIFT beyond the edge; one world per edge, the larger support counts. Claims on gradient probes
or caption statistics are not simulated: their null world is not a change of rows, and their specificity
is NaN with the reason in `specificity_note`.

`python -m hnclip.claims.specificity` measures every rule at the paper's test sizes (Table A1), with its
`size` from the calibration, and writes `specificity.json` beside claims.yaml, each entry with the
hash of the rule it measured (`rule_hash`): the scorecard reads it (hnclip.claims.verdicts), and a
rule edited since is reported as not measured until the file is rewritten.

Unlike the calibration, which draws rows independently (the least favourable case for an exact
reproduction), outcomes here are correlated between runs (`WorldCells`, `correlation`): real runs share
easy and hard queries, which narrows a paired interval and makes a tie tolerance easier to pass when the
effect is absent. The correlation is measured from a built profile's evaluation records
(`--correlation-from results/evals`, `rank_correlation`) and recorded with the file's settings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd

from hnclip.claims.calibration import (
    BatchedCells,
    QueryPool,
    SimulatedSource,
    batch_verdicts,
    batchable,
    printed,
    support_rates,
    true_recall,
)
from hnclip.claims.definitions import SPECIFICITY_FILE, claim_definitions, row_of, rule_hash
from hnclip.claims.evidence import paper_cells
from hnclip.claims.preconditions import paper_conditions
from hnclip.claims.tie import CORRELATION, Z_TIE, TieModel, paper_model, paper_test_sizes, resolved
from hnclip.claims.verdicts import judge_claim
from hnclip.evaluation.bootstrap import Bootstrap, BootstrapSettings
from hnclip.io import read_json, write_json
from hnclip.report.effects import CellUnavailable

SHIFT = 1.0                       # R@1 points the reversed world moves an effect the other way
TIMING_SHIFT = 1.1                # the factor the reversed world moves a timing ratio the other way
WORLDS = ("null", "reversed")
SIGNED_REDUCERS = (None, "value", "min", "max", "mean", "count_positive", "count_nonnegative")


def claim_direction(claim: dict) -> int | None:
    """+1 where the claim says its statistic is high (a row above another), −1 where low, None where it
    claims closeness (a band, an absolute deviation)."""
    decision = claim.get("real_data_decision", claim["decision"])
    if decision["op"] == "between" or claim["statistic"].get("reduce") not in SIGNED_REDUCERS:
        return None
    return 1 if decision["op"] in (">", ">=") else -1


@dataclass
class World:
    """A truth for the simulated reproduction's cells other than the paper's printed numbers.
    `equal[(table, row)]`: Equalities, the first that covers a cell's benchmark sets its truth; `flat`
    rows keep their best value at every epoch; `offset` R@1 points are added to a row's truth."""
    equal: dict[tuple[str, str], list[Equality]] = field(default_factory=dict)
    flat: set[tuple[str, str]] = field(default_factory=set)
    offset: dict[tuple[str, str], float] = field(default_factory=dict)

    def truth(self, table: str, row: str, part: tuple[str, str, str], selection, depth: int = 0) -> float:
        return self._truth(table, row, part, selection, depth) + self.offset.get((table, row), 0.0)

    def _truth(self, table: str, row: str, part: tuple[str, str, str], selection, depth: int) -> float:
        key = (table, row)
        rule = next((e for e in self.equal.get(key, []) if e.benchmarks is None or part[0] in e.benchmarks), None)
        if rule is not None and depth < 8:  # depth: a chain of equalities, never a cycle's loop
            source_selection = rule.selections.get(_selection_key(selection), selection)
            values = [self.truth(t, r, part, source_selection, depth + 1) for t, r in rule.sources]
            values = sorted((v for v in values if not math.isnan(v)), reverse=True)
            if len(values) >= rule.rank:
                return values[rule.rank - 1] + rule.shift
        return printed(table, row, part) if key in self.flat else true_recall(table, row, part, selection)


@dataclass(frozen=True)
class Equality:
    """A row's truth: the `rank`-th best of its `sources`' truths plus `shift`, on `benchmarks` (None: all),
    the sources read at the selection `selections` maps the row's to (the a side's -> the b side's)."""
    sources: list[tuple[str, str]]
    rank: int = 1
    shift: float = 0.0
    selections: dict = field(default_factory=dict)
    benchmarks: frozenset | None = None


def _selection_key(selection):
    return "best" if selection is None else selection


def _b_sources(b: str | list[str], b_table: str) -> list[tuple[str, str]]:
    """A contrast's b side as (table, row) pairs: one row or several, each possibly "row@table"."""
    return [row_of(row, b_table)[::-1] for row in ([b] if isinstance(b, str) else b)]


def _leaves_into(statistic: dict, world: World, shift: list[float]) -> bool:
    """Make every leaf of `statistic` null in `world`; the first contrast takes the pending `shift`.
    False where a leaf is not a comparison of rows."""
    for composite in ("difference", "concat"):
        if composite in statistic:
            return all(_leaves_into(s, world, shift) for s in statistic[composite])
    if "contrast" in statistic:
        spec = statistic["contrast"]
        table, b_table = spec["table"], spec.get("b_table", spec["table"])
        a_selection = _selection_key(spec.get("a_selection", spec.get("selection")))
        b_selection = spec.get("b_selection", spec.get("selection"))
        selections = {} if spec.get("epochs") == "each" else {a_selection: b_selection}
        moved, shift[:] = shift[0], [0.0]
        # a moved contrast moves its own benchmarks only: another leaf may compare the same rows elsewhere
        benchmarks = frozenset(spec["columns"]["benchmarks"]) if moved else None
        for a, b in spec["pairs"]:
            sources = _b_sources(b, b_table)
            world.equal.setdefault((table, a), []).append(
                Equality(sources, spec.get("b_rank", 1), moved, selections, benchmarks))
        return True
    if "spread" in statistic or "order_preserved" in statistic:
        spec = statistic.get("spread") or statistic["order_preserved"]
        rows = spec.get("rows") or [*spec["reference"], *spec["replicate"]]
        for row in rows[1:]:
            world.equal.setdefault((spec["table"], row), []).append(Equality([(spec["table"], rows[0])]))
        return True
    if "trajectory" in statistic:
        spec = statistic["trajectory"]
        world.flat |= {(spec["table"], row) for row in spec["rows"]}
        return True
    return False


@dataclass(frozen=True)
class TimingWorld:
    """A paired timing claim's world: the numerator row's true step time makes the ratio `ratio`."""
    table: str
    numerator: str
    denominator: str
    ratio: float


PROBES = "not a comparison of retrieval cells or a paired timing (gradient probes, caption statistics)"


def closeness_worlds(claim: dict, kind: str) -> list[World] | str:
    """A closeness claim's worlds, its thresholds resolved (hnclip.claims.tie.resolved), one per edge of its
    band: the claimed closeness just absent, the statistic's truth on the edge (null), or SHIFT beyond it
    (reversed). A bound on |a − b| (`abs_mean`, `max_abs`): every a row at its b row ± the bound; a band
    ("between") on a signed statistic: every a row moved so that the paper's number lands on the edge."""
    decision, statistic = claim.get("real_data_decision", claim["decision"]), claim["statistic"]
    spec = statistic.get("contrast")
    if spec is None:
        return "a closeness claim on more than one contrast: no world of its own"
    table, b_table = spec["table"], spec.get("b_table", spec["table"])
    if any(isinstance(decision.get(k), str) for k in ("threshold", "low", "high")):
        raise ValueError(f"claim {claim['claim_id']}: resolve its tie expressions first (hnclip.claims.tie.resolved)")
    beyond = SHIFT if kind == "reversed" else 0.0
    worlds = []
    if statistic.get("reduce") in ("abs_mean", "max_abs") and decision["op"] in ("<", "<="):
        for edge in (decision["threshold"] + beyond, -decision["threshold"] - beyond):
            world = World()
            for a, b in spec["pairs"]:
                world.equal[table, a] = [Equality(_b_sources(b, b_table), spec.get("b_rank", 1), edge)]
            worlds.append(world)
    elif decision["op"] == "between" and claim.get("paper_number") is not None:
        for edge in (decision["low"] - beyond, decision["high"] + beyond):
            moved = edge - float(claim["paper_number"])
            worlds.append(World(offset={(table, a): moved for a, _ in spec["pairs"]}))
    else:
        return "a closeness claim whose band is not a bound on a contrast"
    return worlds


def world_of(claim: dict, kind: str) -> World | list[World] | TimingWorld | str:
    """The claim's null or reversed world (a closeness claim's: one per edge of its band), or why it has
    none. A closeness claim's thresholds must be resolved."""
    direction = claim_direction(claim)
    if not batchable(claim["statistic"]) and "paired_timing" not in claim["statistic"]:
        return PROBES
    if direction is None:
        return closeness_worlds(claim, kind)
    if "paired_timing" in claim["statistic"]:
        # the ratio the claim bounds sits on its threshold (null), or TIMING_SHIFT beyond it (reversed)
        spec, decision = claim["statistic"]["paired_timing"], claim.get("real_data_decision", claim["decision"])
        ratio = decision["threshold"] * (TIMING_SHIFT ** -direction if kind == "reversed" else 1.0)
        return TimingWorld(spec["table"], spec["numerator"], spec["denominator"], ratio)
    world = World()
    shift = [-direction * SHIFT if kind == "reversed" else 0.0]
    if not _leaves_into(claim["statistic"], world, shift):
        return "not a comparison of rows"
    return world


class TimingWorldSource(SimulatedSource):
    """SimulatedSource whose paired step times follow a TimingWorld's ratio."""

    def __init__(self, pool: QueryPool, rng: np.random.Generator, world: TimingWorld):
        super().__init__(pool, rng)
        self.world = world

    def step_times(self, table: str, row: str) -> np.ndarray:
        times = super().step_times(table, row)
        if (table, row) != (self.world.table, self.world.numerator):
            return times
        truth = {name: printed(table, name, (paper_cells(table).benchmark_of(name), "none", "wall_clock_min"))
                 for name in (self.world.numerator, self.world.denominator)}
        return times * self.world.ratio * truth[self.world.denominator] / truth[self.world.numerator]


def _timing_support(claim: dict, pool: QueryPool, rng: np.random.Generator, world: TimingWorld, n_sims: int) -> float:
    """The share of n_sims simulated paired timings in `world` that the rule calls supported."""
    conditions = paper_conditions()
    verdicts = [judge_claim(claim, TimingWorldSource(pool, rng, world), conditions, pool.boot)["verdict"]
                for _ in range(n_sims)]
    return sum(v == "supported" for v in verdicts) / n_sims


class WorldCells(BatchedCells):
    """BatchedCells whose truth is a World's, with outcomes correlated between runs: query q of a row is
    a hit when Φ(√ρ·Z_q + √(1−ρ)·E_q,row) < the row's true Recall (a Gaussian copula; Z is shared by every
    run on the test set and direction, as real runs share easy and hard queries; E is the run's own, the
    same at every epoch, so a run's epochs are nested). The bootstrap resamples the queries as the
    scorecard does, the same resamples for every cell of a test set."""

    def __init__(self, pool: QueryPool, rng: np.random.Generator, sims: int, world: World, correlation: float,
                 seed_sd: float = 0.0):
        super().__init__(pool, rng, sims, seed_sd)
        self.world, self.correlation = world, correlation
        self._shared: dict[tuple[str, str], np.ndarray] = {}
        self._own: dict[tuple[str, str, str, str], np.ndarray] = {}
        self._cells: dict[tuple, np.ndarray] = {}

    def truth(self, table: str, row: str, part: tuple[str, str, str], selection) -> float:
        return self.world.truth(table, row, part, selection)

    def _latent_normal(self, table: str, row: str, benchmark: str, direction: str) -> np.ndarray:
        n = self.pool.sizes[benchmark]
        if (benchmark, direction) not in self._shared:
            self._shared[benchmark, direction] = self.rng.standard_normal((self.sims, n), dtype=np.float32)
        key = (table, row, benchmark, direction)
        if key not in self._own:
            own = self.rng.standard_normal((self.sims, n), dtype=np.float32)
            rho = self.correlation
            self._own[key] = math.sqrt(rho) * self._shared[benchmark, direction] + math.sqrt(1 - rho) * own
        return self._own[key]

    def cell(self, table: str, row: str, part: tuple[str, str, str], selection) -> np.ndarray:
        key = (table, row, part, selection)
        if key not in self._cells:  # a b row is read once per pair that names it
            self._cells[key] = self._draw(table, row, part, selection)
        return self._cells[key]

    def _draw(self, table: str, row: str, part: tuple[str, str, str], selection) -> np.ndarray:
        benchmark, direction, _ = part
        if math.isnan(printed(table, row, part)):
            raise CellUnavailable(f"not a cell of {table}", f"{table} {row}/{'/'.join(part)}")
        truth = min(max(self.truth(table, row, part, selection) / 100.0, 0.0), 1.0)
        latent = self._latent_normal(table, row, benchmark, direction)
        hits = (latent < NormalDist().inv_cdf(truth) if 0 < truth < 1 else np.full(latent.shape, truth >= 1))
        hits = hits.astype(np.float32)
        n = hits.shape[1]
        draws = np.empty((self.sims, self.boot.settings.resamples + 1))
        draws[:, 0] = hits.sum(axis=1)
        draws[:, 1:] = hits @ self.boot.counts(benchmark, n).T  # the scorecard's own query resamples
        return self.with_seed_term((draws * (100.0 / n)).ravel(), table, row, benchmark, direction)


def specificity(claims: list[dict], n_sims: int = 200, resamples: int = 100, seed: int = 0,
                model: TieModel | None = None, correlation: float = CORRELATION) -> pd.DataFrame:
    """Per claim: `null_support`, `reversed_support` (NaN where not simulated) and `specificity_note`, at
    `model`'s test sizes, ties and seed term (default: the paper's; `correlation`: the runs' outcomes')."""
    rng = np.random.default_rng(seed)
    model = model or paper_model(correlation)
    pool = QueryPool(Bootstrap(BootstrapSettings(resamples=resamples, seed=seed)), rng, model.sizes)
    rows = []
    for claim in (resolved(c, model) for c in claims):
        row = {"claim_id": claim["claim_id"], "specificity_note": ""}
        decision = claim.get("real_data_decision", claim["decision"])
        for kind in WORLDS:
            world = world_of(claim, kind)
            if isinstance(world, str):
                row[f"{kind}_support"], row["specificity_note"] = math.nan, world
                continue
            if isinstance(world, TimingWorld):
                row[f"{kind}_support"] = _timing_support(claim, pool, rng, world, n_sims)
                continue
            row[f"{kind}_support"] = max(
                sum(v == "supported" for v in batch_verdicts(
                    claim, WorldCells(pool, rng, n_sims, edge, correlation, model.seed_sd), decision)) / n_sims
                for edge in (world if isinstance(world, list) else [world]))
        rows.append(row)
    return pd.DataFrame(rows)


# ---- the rules' specificity, kept beside claims.yaml ------------------------------------------------
SETTINGS = {"sims": 200, "resamples": 100, "seed": 0, "shift": SHIFT}


def measure_rules(claims: list[dict], sims: int, resamples: int, seed: int,
                  correlation: float = CORRELATION) -> dict[str, dict]:
    """Per claim at the paper's test sizes: `size` (supported in an exact reproduction, independent rows:
    hnclip.claims.calibration), `null_support`, `reversed_support` and the note, with the rule's hash.
    The ties are the formula's at the paper's sizes with `correlation` (hnclip.claims.tie)."""
    model = paper_model(correlation)
    sizes = support_rates(claims, n_sims=sims, resamples=resamples, seed=seed,
                          model=model).set_index("claim_id")["supported"]
    worlds = specificity(claims, n_sims=sims, resamples=resamples, seed=seed, model=model, correlation=correlation)
    out = {}
    for claim, world in zip(claims, worlds.to_dict("records")):
        out[claim["claim_id"]] = {"rule_hash": rule_hash(claim), "size": float(sizes[claim["claim_id"]]),
                                  **{k: (None if isinstance(v, float) and math.isnan(v) else v)
                                     for k, v in world.items() if k != "claim_id"}}
    return out


def rank_correlation(evals: Path) -> dict:
    """The correlation between runs' per-query outcomes on one test set, from evaluation records (and the
    commits that wrote them)
    (results/evals/<run>/<benchmark>.json, their best epoch's per-query ranks): for every pair of runs on
    a test set and direction, the Spearman correlation of their ranks, as the Gaussian copula's ρ
    (2 sin(π ρ_s / 6)); the median over all pairs, and per test set and direction."""
    by_test_set: dict[str, dict[str, np.ndarray]] = {}
    commits: set[str] = set()
    for record_path in sorted(evals.glob("*/*.json")):
        record = read_json(record_path)
        commits.add(str(record.get("provenance", {}).get("git", {}).get("commit")))
        for direction, ranks in (record.get("best", {}).get("metrics", {}).get("ranks") or {}).items():
            key = f"{record_path.stem}/{direction}"
            by_test_set.setdefault(key, {})[record_path.parent.name] = pd.Series(ranks).rank().to_numpy()
    per_set, every = {}, []
    for key, runs in sorted(by_test_set.items()):
        names = sorted(runs)
        values = [2 * math.sin(math.pi * float(np.corrcoef(runs[a], runs[b])[0, 1]) / 6)
                  for i, a in enumerate(names) for b in names[i + 1:] if len(runs[a]) == len(runs[b])]
        if values:
            per_set[key] = {"runs": len(names), "median": round(float(np.median(values)), 3)}
            every += values
    if not every:
        raise ValueError(f"{evals}: no evaluation records with per-query ranks of two runs on one test set")
    return {"correlation": round(float(np.median(every)), 3), "pairs": len(every), "by_test_set": per_set,
            "records_of_commits": sorted(commits)}


def main(argv: list[str] | None = None) -> int:
    """python -m hnclip.claims.specificity: measure every rule and write specificity.json."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, default=SPECIFICITY_FILE)
    parser.add_argument("--correlation-from", type=Path, default=None, metavar="EVALS",
                        help="measure the between-run correlation from these evaluation records (results/evals "
                             f"of a built profile) instead of taking {CORRELATION}")
    args = parser.parse_args(argv)
    measured_rho = rank_correlation(args.correlation_from) if args.correlation_from else None
    rho = measured_rho["correlation"] if measured_rho else CORRELATION
    claims = claim_definitions()
    measured = measure_rules(claims, SETTINGS["sims"], SETTINGS["resamples"], SETTINGS["seed"], rho)
    model = paper_model(rho)
    settings = {**SETTINGS, "correlation": rho, "correlation_measured": measured_rho, "test_sizes": paper_test_sizes(),
                "tie": {"z": Z_TIE, "seed_sd": round(model.seed_sd, 4), "seed_source": model.seed_source}}
    write_json(args.out, {"settings": settings, "claims": measured})
    print(f"wrote {args.out}: {len(measured)} rules, between-run correlation {rho}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
