"""The simulated worlds a claim's rule is asked in (`hnclip.claims.specificity` measures them): the null and
reversed worlds of a comparison, the equivalence test's worlds of a closeness claim, the world each rule
denies (`denied_worlds`: an "all K" rule with one item at no effect, a best-of rule with the runner-up
equal, a trajectory one step out of shape) and the timing claims' worlds."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hnclip.claims.calibration import (
    EPOCHS,
    batchable,
    printed,
    true_recall,
)
from hnclip.claims.definitions import row_of, statistic_leaves
from hnclip.claims.statistics import statistic_columns
from hnclip.report.effects import CellUnavailable

SHIFT = 1.0                       # R@1 points the reversed world moves an effect the other way
TIMING_SHIFT = 1.1                # the factor the reversed world moves a timing ratio the other way
WORLDS = ("null", "reversed")
SIGNED_REDUCERS = (None, "value", "min", "max", "mean", "count_positive", "count_nonnegative", "second_smallest")


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
    moves: dict[tuple[str, str], list[EpochMove]] = field(default_factory=dict)

    def truth(self, table: str, row: str, part: tuple[str, str, str], selection, depth: int = 0) -> float:
        move = next((m for m in self.moves.get((table, row), []) if m.epoch == selection and part[0] in m.benchmarks),
                    None)
        if move is not None:
            return self.truth(table, row, part, move.reference, depth + 1) + move.delta
        return self._truth(table, row, part, selection, depth) + self.offset.get((table, row), 0.0)

    def _truth(self, table: str, row: str, part: tuple[str, str, str], selection, depth: int) -> float:
        key = (table, row)
        rule = next((e for e in self.equal.get(key, []) if e.covers(part)), None)
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
    parts: frozenset | None = None   # only these cells (benchmark, direction, metric): one item of a claim

    def covers(self, part: tuple[str, str, str]) -> bool:
        return (self.benchmarks is None or part[0] in self.benchmarks) and (self.parts is None or part in self.parts)


@dataclass(frozen=True)
class EpochMove:
    """A row's truth at `epoch` on `benchmarks`: its truth at epoch `reference` plus `delta` (a trajectory
    whose claimed shape fails by one step: an epoch out of order, the peak one epoch later)."""
    epoch: int
    reference: int
    delta: float
    benchmarks: frozenset


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


PROBES = ("not a comparison of retrieval cells or a paired timing (gradient probes, caption statistics: their "
          "worlds are hnclip.claims.probe_worlds')")


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
        bound = float(claim.get("closeness_bound", decision["threshold"]))  # the claim's own, where it states one
        for edge in (bound + beyond, -bound - beyond):
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
    """The claim's null or reversed world (several: the largest support counts), or why it has none. The
    null world is the one its rule is meant to deny (`denied_worlds`); the reversed world makes the compared
    rows equal and moves the first contrast SHIFT against the claim. Thresholds must be resolved where the
    rule has ties."""
    direction = claim_direction(claim)
    if not batchable(claim["statistic"]) and "paired_timing" not in claim["statistic"]:
        return PROBES
    if direction is None:
        return closeness_worlds(claim, kind)
    if "paired_timing" in claim["statistic"]:
        # the ratio the claim bounds sits on its threshold (null), or TIMING_SHIFT beyond it (reversed); in
        # both, the load on the numerator's run drifts (TimingWorldSource)
        spec, decision = claim["statistic"]["paired_timing"], claim.get("real_data_decision", claim["decision"])
        ratio = decision["threshold"] * (TIMING_SHIFT ** -direction if kind == "reversed" else 1.0)
        return TimingWorld(spec["table"], spec["numerator"], spec["denominator"], ratio)
    denied = denied_worlds(claim, SHIFT if kind == "reversed" else 0.0)
    if denied is not None:
        return denied
    world = World()
    shift = [-direction * SHIFT if kind == "reversed" else 0.0]
    if not _leaves_into(claim["statistic"], world, shift):
        return "not a comparison of rows"
    return world


# ---- the world each rule is meant to deny -------------------------------------------------------------
DENIED_ITEMS = 3   # an "all K" rule: the items nulled in turn, those of the smallest printed margin (the
                   # least favourable: the others keep their largest margins); the largest support counts


@dataclass(frozen=True)
class Item:
    """One item of a contrast as the paper prints it: a row, its competitor on the column, its margin."""
    row: str
    competitor: tuple[str, str]
    column: object
    margin: float


def paper_items(spec: dict) -> list[Item]:
    """A contrast's items on the paper's printed numbers: each pair and column the a row has, with the
    competitor that is the `b_rank`-th best on that column (its mean over the column's cells)."""
    table, b_table, rank = spec["table"], spec.get("b_table", spec["table"]), spec.get("b_rank", 1)
    items = []
    for a, b in spec["pairs"]:
        for column in statistic_columns(spec["columns"]):
            a_value = np.mean([printed(table, a, part) for part in column.parts])
            if math.isnan(a_value):
                continue
            others = sorted(((np.mean([printed(t, r, part) for part in column.parts]), (t, r))
                             for t, r in _b_sources(b, b_table)), key=lambda x: -x[0] if not math.isnan(x[0]) else 1e9)
            value, competitor = others[min(rank, len(others)) - 1]
            items.append(Item(a, competitor, column, float(a_value - value)))
    return items


def _items_needed(claim: dict, total: int) -> int | None:
    """How many items must lose their effect for the claim to be false (None: not an "all K" rule)."""
    statistic, decision = claim["statistic"], claim.get("real_data_decision", claim["decision"])
    reduce = statistic.get("reduce")
    if reduce in ("count_positive", "count_nonnegative") and decision["op"] in (">=", ">"):
        k = decision["threshold"] + (1 if decision["op"] == ">" else 0)
        return max(1, total - int(math.ceil(k)) + 1)
    return {"min": 1, "second_smallest": 2}.get(reduce)


def denied_worlds(claim: dict, beyond: float = 0.0) -> list[World] | None:
    """The least favourable worlds in which the claim is false, for the rules whose plain null is the easiest
    one to reject (None: the plain null of `_leaves_into` is the denied world):

    * an "all K" rule (every item, K of N, the smallest item above a bound) on one contrast: the fewest items
      that make it false at no effect (each at its competitor on its column), the others at the paper's
      values; where one item suffices, each of the DENIED_ITEMS of smallest printed margin in turn;
    * a best-of rule (one item against the best of several rows): the row at the runner-up that is best on
      the compared column (a pooled column's best row, not each cell's best);
    * a trajectory: the claimed shape fails by the rule's tie (an epoch one tie below the one before it; the
      peak one epoch later, one tie above epoch 1), one benchmark at a time.
    `beyond`: R@1 points further against the claim (the reversed world)."""
    statistic = claim["statistic"]
    if "contrast" in statistic and claim_direction(claim) == 1:
        spec = statistic["contrast"]
        try:
            items = paper_items(spec)
        except CellUnavailable:  # a table the paper does not print (a control of ours): the plain null
            return None
        if not items:
            return None
        needed = _items_needed(claim, len(items))
        by_margin = sorted(items, key=lambda item: item.margin)
        if needed is not None and needed < len(items):
            groups = [[item] for item in by_margin[:DENIED_ITEMS]] if needed == 1 else [by_margin[:needed]]
        elif len(items) == 1 or statistic.get("reduce") in (None, "value"):
            groups = [items]  # every item at its best competitor on the column
        else:
            return None
        # a magnitude (the smallest item at least T > 0) is denied at T, a lead or tie at no effect
        decision = claim.get("real_data_decision", claim["decision"])
        magnitude = statistic.get("reduce") in (None, "value", "min")
        at = max(float(decision.get("threshold", 0.0)), 0.0) if magnitude else 0.0
        return [_null_items(spec, group, at - beyond) for group in groups]
    trajectories = [leaf["trajectory"] for leaf in statistic_leaves(statistic) if "trajectory" in leaf]
    if trajectories and claim.get("tie"):
        return _trajectory_worlds(trajectories, claim["tie"] + beyond)
    return None


def _null_items(spec: dict, items: list[Item], at: float = 0.0) -> World:
    table = spec["table"]
    a_selection = _selection_key(spec.get("a_selection", spec.get("selection")))
    selections = {} if spec.get("epochs") == "each" else {a_selection: spec.get("b_selection", spec.get("selection"))}
    world = World()
    for item in items:
        world.equal.setdefault((table, item.row), []).append(
            Equality([item.competitor], 1, at, selections, parts=frozenset(item.column.parts)))
    return world


def _trajectory_worlds(specs: list[dict], tie: float) -> list[World]:
    worlds = []
    measures = {spec["measure"] for spec in specs}
    for spec in specs[:1]:
        for row in spec["rows"]:
            for benchmark in spec["columns"]["benchmarks"]:
                for epoch, reference, delta in (
                        [(2, 1, tie)] if measures & {"peak_first", "first_minus_last"}  # the peak one epoch later
                        else [(e, e - 1, -tie) for e in (2, EPOCHS // 2, EPOCHS)]):  # one epoch out of order
                    worlds.append(World(moves={(spec["table"], row): [
                        EpochMove(epoch, reference, delta, frozenset([benchmark]))]}))
    return worlds
