"""The worlds a rule on gradient probes or caption statistics is meant to deny (hnclip.claims.specificity
measures how often the rule still says "supported" there).

* **Caption statistics** (`caption_geometry`) are deterministic: a benchmark's statistic is one number of
  its test captions under the encoder, with no sampling interval. Such a claim is an exact check against
  the paper's value with the tolerance claims.yaml states (`exact_check`: the printed rounding and why the
  tolerance is what it is). Its denied worlds: one benchmark at a time (the others at the paper's values)
  just outside the tolerance, by the printed rounding (the smallest miss the paper's precision shows).
* **Gradient probes** (`probe`): the records of the calibration's truth (hnclip.claims.calibration
  `probe_records`, the numbers the paper's text states) moved onto the claim's boundary, the least
  favourable way (`boundary_records`): a share with the fewest records flipped so that it equals the
  threshold; a mean or median shifted, a median ratio or peak ratio scaled onto it; for a minimum over runs or
  epochs only the smallest one moved; a first crossing put on the threshold step. Each simulated reproduction
  is a block bootstrap of those records: the blocks are a run's epochs (its ~15-75 probes share the
  model's state and the training trend), each epoch's probe slots drawn with replacement from that epoch's
  records and kept at their steps; a first-crossing claim splits the blocks at its step, so that no record
  crosses sides. The rule then judges each reproduction with its own (record-level) bootstrap.

Both give one world per edge of a band and per moved item; the largest support counts. The reversed
world moves the boundary further against the claim (`BEYOND`)."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np

from hnclip.claims.calibration import (
    FIG4_RUN,
    FIGA8_RUNS,
    IN_BATCH_SHARE_GE_08,
    QueryPool,
    SimulatedSource,
    probe_records,
)
from hnclip.claims.definitions import statistic_leaves
from hnclip.claims.evidence import PAPER_GEOMETRY, paper_geometry
from hnclip.claims.preconditions import paper_conditions
from hnclip.claims.verdicts import judge_claim

FIGURE_RUNS = {"fig4_gradient_dynamics": [FIG4_RUN], "figA8_gradient_dynamics_scales": FIGA8_RUNS}
SHARES = ("share_below", "share_at_least", "share_true", "share_false", "share_positive")
# How far the reversed world moves the boundary against the claim: a share or a cosine by 0.05, a ratio by
# half a decade, a first crossing by 50 optimizer steps (ten probes)
BEYOND = {"share": 0.05, "value": 0.05, "log10": 0.5, "step": 50}


def exact_worlds(claim: dict, kind: str) -> list[dict[str, float]] | str:
    """An exact check's worlds: {benchmark: its statistic's true value} for every benchmark, one of them
    just outside the decision's tolerance (by the printed rounding; `kind` reversed: by one more unit of the
    printed digit), the others at the paper's values; or why it has none."""
    check, spec = claim.get("exact_check"), claim["statistic"].get("caption_geometry")
    if check is None or spec is None:
        return "a caption statistic without an `exact_check` (its tolerance and why) in claims.yaml"
    decision, reduce = claim.get("real_data_decision", claim["decision"]), claim["statistic"].get("reduce")
    rounding = float(check["printed_rounding"])
    miss = rounding * (3 if kind == "reversed" else 1)  # one more unit of the digit: 2 × rounding further
    threshold = float(decision["threshold"])
    if reduce == "max_abs" and decision["op"] in ("<", "<="):
        misses = [threshold + miss, -threshold - miss]
    elif reduce == "min" and decision["op"] in (">", ">="):
        misses = [threshold - miss]
    elif reduce == "max" and decision["op"] in ("<", "<="):
        misses = [threshold + miss]
    else:
        return f"an exact check whose decision ({decision['op']} on {reduce}) has no denied world here"
    base = {b: exact_truth(spec, b) for b in spec["benchmarks"]}
    worlds = []
    for benchmark in spec["benchmarks"]:
        for value in misses:
            offset = paper_geometry(benchmark, spec["field"]) if spec.get("versus_paper") else 0.0
            worlds.append({**base, benchmark: offset + value})
    return worlds


def exact_truth(spec: dict, benchmark: str) -> float:
    """A caption statistic's true value as the paper prints it (Table A1; the in-batch shares of A.4 as
    the calibration assumes them per benchmark)."""
    if spec["field"] in PAPER_GEOMETRY:
        return paper_geometry(benchmark, spec["field"])
    return IN_BATCH_SHARE_GE_08[benchmark]


class ExactSource(SimulatedSource):
    """A reproduction that computes a world's caption statistics exactly (they have no sampling noise)."""

    def __init__(self, pool: QueryPool, rng: np.random.Generator, truth: dict[str, float]):
        super().__init__(pool, rng)
        self.truth = truth

    def caption_geometry(self, benchmark: str, field: str) -> np.ndarray:
        return np.array([self.truth[benchmark]])


def exact_support(claim: dict, pool: QueryPool, rng: np.random.Generator, kind: str) -> float:
    """The largest share of an exact check's worlds that the rule calls supported (each world is judged
    once: a deterministic statistic gives every reproduction the same value)."""
    worlds = exact_worlds(claim, kind)
    if isinstance(worlds, str):
        raise ValueError(f"{claim['claim_id']}: {worlds}")
    return max(float(judge_claim(claim, ExactSource(pool, rng, world), paper_conditions(), pool.boot)["verdict"]
                     == "supported") for world in worlds)


# ---- gradient probes ----------------------------------------------------------------------------------
def _probe_spec(claim: dict) -> dict | None:
    leaves = statistic_leaves(claim["statistic"])
    return leaves[0]["probe"] if len(leaves) == 1 and "probe" in leaves[0] else None


def _selected(spec: dict, records: list[dict]) -> list[int]:
    """Indices of the records a probe statistic reads (its epoch, its later epochs)."""
    index = list(range(len(records)))
    if "epoch" in spec:
        index = [i for i in index if records[i]["epoch"] == spec["epoch"]]
    if "from_epoch_fraction" in spec:
        last = max(records[i]["epoch"] for i in index)
        index = [i for i in index if records[i]["epoch"] > spec["from_epoch_fraction"] * last]
    return index


def _share_measure(spec: dict) -> str:
    return spec["measure"].replace("min_epoch_", "")


def _indicator(spec: dict, record: dict) -> bool | None:
    """Whether a record counts towards a share (None: it is not one of the share's records)."""
    measure, value = _share_measure(spec), record[spec["field"]]
    if measure in ("share_below", "share_at_least"):
        return (value < spec["threshold"]) == (measure == "share_below")
    if measure in ("share_true", "share_false"):
        return bool(value) == (measure == "share_true")
    return None if value is None else value > 0  # share_positive


def _set_indicator(spec: dict, record: dict, on: bool) -> None:
    measure, field = _share_measure(spec), spec["field"]
    if measure in ("share_below", "share_at_least"):
        below = on == (measure == "share_below")
        record[field] = spec["threshold"] / 10 if below else spec["threshold"] * 10
    elif measure in ("share_true", "share_false"):
        record[field] = on == (measure == "share_true")
    else:  # share_positive: the cosine's sign
        size = abs(record[field]) or 0.1
        record[field] = size if on else -size


def _ratios(spec: dict, records: list[dict], index: list[int]) -> np.ndarray:
    field, over = spec["field"], spec["over"]
    return np.array([records[i][field] / records[i][over] for i in index if records[i][over] > 0])


def _item_value(spec: dict, records: list[dict], index: list[int]) -> float:
    """The probe statistic on the records `index` (one run's, one epoch's, or all of them)."""
    measure = _share_measure(spec)
    if measure in SHARES:
        flags = [_indicator(spec, records[i]) for i in index]
        flags = [f for f in flags if f is not None]
        return sum(flags) / len(flags) if flags else math.nan
    if measure in ("mean", "median"):
        values = [records[i][spec["field"]] for i in index if records[i][spec["field"]] is not None]
        return float(np.mean(values) if measure == "mean" else np.median(values))
    ratios = _ratios(spec, records, index)
    if not len(ratios):
        return math.nan
    return float(np.median(ratios) if measure == "median_ratio" else math.log10(ratios.max()))


def _move_item(spec: dict, records: list[dict], index: list[int], boundary: Boundary,
               rng: np.random.Generator) -> None:
    """Move one item (a run's or an epoch's records, or all of them) onto `boundary`: a share
    by flipping the fewest records, drawn at random; a mean or median by a shift; a ratio by a scale."""
    measure, field = _share_measure(spec), spec["field"]
    if measure in SHARES:
        flagged = [i for i in index if _indicator(spec, records[i]) is not None]
        on = [i for i in flagged if _indicator(spec, records[i])]
        off = [i for i in flagged if not _indicator(spec, records[i])]
        wanted = min(max(boundary.count(len(flagged)), 0), len(flagged))
        flip, to = (on, False) if len(on) > wanted else (off, True)
        for i in rng.permutation(flip)[:abs(len(on) - wanted)]:
            _set_indicator(spec, records[int(i)], to)
    elif measure in ("mean", "median"):
        shift = boundary.continuous() - _item_value(spec, records, index)
        for i in index:
            if records[i][field] is not None:
                records[i][field] += shift
    elif measure in ("median_ratio", "max_log10_ratio"):
        value, target = _item_value(spec, records, index), boundary.continuous()
        factor = target / value if measure == "median_ratio" else 10 ** (target - value)
        for i in index:
            records[i][field] *= factor
    else:
        raise ValueError(f"no boundary world for the probe measure {spec['measure']!r}")


def boundary_records(claim: dict, records: list[dict], boundary: Boundary, rng: np.random.Generator) -> list[dict]:
    """The records moved onto the claim's boundary (just where it turns false), the least
    favourable way: a minimum over runs (`per_run`, reduce min) or over epochs (`min_epoch_*`) moves only its
    smallest item; a first crossing moves the crossing to the first probe at or after the target step."""
    spec, out = _probe_spec(claim), copy.deepcopy(records)
    index = _selected(spec, out)
    if spec["measure"] == "first_step_below":  # "before step T": the first crossing at or after T
        field, threshold, target = spec["field"], spec["threshold"], boundary.value
        for i in index:
            if out[i]["step"] < target and out[i][field] < threshold:
                out[i][field] = threshold  # no crossing before the boundary step
        later = sorted((out[i]["step"], i) for i in index if out[i]["step"] >= target)
        if later:
            out[later[0][1]][field] = threshold / 10
        return out
    key = "run" if spec.get("per_run") else "epoch" if spec["measure"].startswith("min_epoch_") else None
    groups: dict = {}
    for i in index:
        groups.setdefault(None if key is None else out[i][key], []).append(i)
    values = {k: _item_value(spec, out, g) for k, g in groups.items()}
    smallest = min((k for k in values if not math.isnan(values[k])), key=values.get)
    _move_item(spec, out, groups[smallest], boundary, rng)
    return out


def block_bootstrap(records: list[dict], rng: np.random.Generator, split_step: float | None = None) -> list[dict]:
    """One reproduction's records: within each block (a run's epoch; split at `split_step`), the block's
    probe slots (steps) keep their places and draw their values with replacement from the block's records."""
    blocks: dict = {}
    for r in records:
        side = None if split_step is None else r["step"] < split_step
        blocks.setdefault((r.get("run"), r["epoch"], side), []).append(r)
    out = []
    for block in blocks.values():
        steps = sorted(r["step"] for r in block)
        drawn = rng.integers(0, len(block), len(block))
        out += [{**block[j], "step": step} for step, j in zip(steps, drawn)]
    return out


@dataclass(frozen=True)
class Boundary:
    """Where a probe claim turns false: its statistic's `value` on the decision's edge, `high` where the claim
    says the statistic is high (then the world sits on or just below the edge), `inclusive` where the edge
    itself satisfies the claim (>=, <=, a band's edges): the world is then just beyond it."""
    value: float
    high: bool
    inclusive: bool

    def continuous(self) -> float:
        """The largest value where the claim is false (a relative 1e-9 past an inclusive edge)."""
        if not self.inclusive:
            return self.value
        step = max(abs(self.value), 1.0) * 1e-9
        return self.value - step if self.high else self.value + step

    def count(self, n: int) -> int:
        """Of n records, the count whose share is the least favourable one where the claim is false."""
        exact = self.value * n
        if self.high:
            return int(math.ceil(exact - 1e-9)) - 1 if self.inclusive else int(math.floor(exact + 1e-9))
        return int(math.floor(exact + 1e-9)) + 1 if self.inclusive else int(math.ceil(exact - 1e-9))


def probe_targets(claim: dict, kind: str) -> list[Boundary] | str:
    """The probe statistic's boundaries (one per edge of a band), moved further against the claim in the
    reversed world (BEYOND); or why it has none."""
    spec = _probe_spec(claim)
    if spec is None:
        return "a probe claim of more than one statistic: no boundary world of its own"
    decision = claim.get("real_data_decision", claim["decision"])
    measure = spec["measure"]
    scale = ("step" if measure == "first_step_below" else "log10" if "ratio" in measure
             else "share" if "share" in measure else "value")
    beyond = BEYOND[scale] if kind == "reversed" else 0.0

    def edge(value: float, high: bool, inclusive: bool) -> Boundary:
        against = 1 if high else -1
        if scale == "log10" and measure != "max_log10_ratio":  # a ratio: half a decade is a factor
            return Boundary(value * 10 ** (-against * beyond), high, inclusive)
        return Boundary(value - against * beyond, high, inclusive)
    if decision["op"] == "between":
        return [edge(decision["low"], True, True), edge(decision["high"], False, True)]
    op = decision["op"]
    return [edge(float(decision["threshold"]), op in (">", ">="), op in (">=", "<="))]


class ProbeSource(SimulatedSource):
    """A reproduction whose probe records are given (a block bootstrap of a boundary world's)."""

    def __init__(self, pool: QueryPool, rng: np.random.Generator, records: list[dict]):
        super().__init__(pool, rng)
        self.records = records

    def probe(self, figure: str, method: str | None) -> list[dict]:
        return self.records


def probe_support(claim: dict, pool: QueryPool, rng: np.random.Generator, kind: str, n_sims: int) -> float:
    """The largest share, over the boundary's worlds, of n_sims block-bootstrap reproductions that the rule
    calls supported."""
    spec, targets = _probe_spec(claim), probe_targets(claim, kind)
    if isinstance(targets, str):
        raise ValueError(f"{claim['claim_id']}: {targets}")
    truth = [r for run in FIGURE_RUNS[spec["figure"]] for r in probe_records(run, rng)]
    split = spec["measure"] == "first_step_below"
    conditions, best = paper_conditions(), 0.0
    for boundary in targets:
        world = boundary_records(claim, truth, boundary, rng)
        split_at = boundary.value if split else None
        sources = (ProbeSource(pool, rng, block_bootstrap(world, rng, split_at)) for _ in range(n_sims))
        verdicts = [judge_claim(claim, source, conditions, pool.boot)["verdict"] for source in sources]
        supported = verdicts.count("supported")
        best = max(best, supported / n_sims)
    return best


def world_support(claim: dict, pool: QueryPool, rng: np.random.Generator, kind: str,
                  n_sims: int) -> tuple[float, int] | str:
    """(support, worlds tried) of a probe or caption-statistics claim in its `kind` world (null, reversed), or
    why it has none."""
    if "caption_geometry" in claim["statistic"]:
        worlds = exact_worlds(claim, kind)
        return worlds if isinstance(worlds, str) else (exact_support(claim, pool, rng, kind), len(worlds))
    targets = probe_targets(claim, kind)
    return targets if isinstance(targets, str) else (probe_support(claim, pool, rng, kind, n_sims), len(targets))


def reads_probes_or_captions(claim: dict) -> bool:
    return any(kind in leaf for leaf in statistic_leaves(claim["statistic"]) for kind in ("probe", "caption_geometry"))
