"""The verdicts: a claim's decision (e.g. "count >= 8", "> 0", "between -1 and 1") applied to its
statistic's estimate and 95 % interval, on this profile's results (`judge_claim`) and on the paper's own
numbers (`paper_judgement`); the scorecard is one row of both per claim.

The verdict categories and their rules live here alone: VERDICT_MEANINGS (what each says, also the
scorecard's legend), `decide` (supported / contradicted / inconclusive from an interval),
`unavailable_verdict` (not_implemented / not_testable from a cell the statistic could not read) and the
precondition gate in `judge_claim` (hnclip.claims.preconditions): a failed precondition makes a
claim not testable; so does one not measured on a profile of real data (on the miniature it is noted)."""
from __future__ import annotations

import math

import pandas as pd

from hnclip.claims.definitions import (
    NULL_SUPPORT_MAX,
    SIZE_MIN,
    claim_definitions,
    rule_hash,
    rule_specificity,
)
from hnclip.claims.evidence import PaperSource, ReproducedSource
from hnclip.claims.preconditions import (
    REGIME_CONDITIONS,
    as_condition,
    paper_conditions,
    profile_conditions,
    unmet_preconditions,
)
from hnclip.claims.statistics import statistic_draws
from hnclip.claims.tie import (
    Z_TIE,
    TieModel,
    claim_benchmarks,
    measured_correlation,
    paper_model,
    profile_model,
    resolved,
)
from hnclip.config.registry import NOT_IMPLEMENTED, Registry
from hnclip.evaluation.bootstrap import Bootstrap
from hnclip.report.effects import CellUnavailable, format_evidence, summarise

VERDICT_MEANINGS = {
    "supported": "the whole 95 % interval satisfies the claim's decision, by a rule that the world it is meant to "
                 "deny (the claim false in the least favourable way, e.g. one of K items without the effect) passes "
                 "at most 10 % of the time (its null support) and an exact reproduction of the paper at least 90 % "
                 "(its size), both at the paper's test sizes and one between-run correlation",
    "consistent": "the interval satisfies the decision, but the rule passes the world it denies too (null "
                  "support above 10 %), passes an exact reproduction less than 90 % of the time, or its null "
                  "support is not measured: the data agree with the claim without confirming it",
    "contradicted": "none of the interval does",
    "inconclusive": "the interval straddles the decision: this profile's data cannot tell",
    "not_testable": "this profile cannot test it: a magnitude of the real benchmarks on the miniature, or a "
                    "regime precondition that fails here (the reason names it and its measured value)",
    "not_implemented": "a row it needs is not trained by this pipeline yet",
}
VERDICTS = tuple(VERDICT_MEANINGS)
SCORECARD_COLUMNS = [
    "claim_id", "quote", "paper_value", "reproduced_value", "ci_low", "ci_high", "verdict", "evidence", "decision",
    "reason", "where", "paper_verdict", "paper_number", "paper_self_consistent", "paper_borderline", "tolerance",
    "sanity_check",
    "requires", "group", "group_reason", "borderline", "size", "null_support", "reversed_support",
    "specificity_note"]
# A claim's group: the paper's own claims, or our additional checks (claims.yaml `group: additional`)
GROUPS = {"paper": "The paper's claims", "additional": "Our additional checks (not claims the paper makes)"}


def claim_decision(claim: dict, real_data) -> dict:
    """The decision a claim is judged by: its `real_data_decision` (where it states one) on real data."""
    return claim.get("real_data_decision", claim["decision"]) if real_data else claim["decision"]


def decision_text(decision: dict, tolerance: float | None = None) -> str:
    """The decision as the scorecard prints it, e.g. `>= 8 (tie tolerance 0.5)`."""
    text = (f"between {decision['low']:g} and {decision['high']:g}" if decision["op"] == "between"
            else f"{decision['op']} {decision['threshold']:g}")
    return text + (f" (tie tolerance {tolerance:g})" if tolerance else "")


def _holds(decision: dict, value: float) -> bool:
    op = decision["op"]
    if op == "between":
        return decision["low"] <= value <= decision["high"]
    threshold = decision["threshold"]
    return {">": value > threshold, ">=": value >= threshold, "<": value < threshold, "<=": value <= threshold}[op]


def decide(decision: dict, value: float, low: float, high: float) -> str:
    """supported / contradicted / inconclusive from the estimate's interval (or the estimate alone)."""
    if math.isnan(low):
        return "supported" if _holds(decision, value) else "contradicted"
    if decision["op"] == "between":
        if decision["low"] <= low and high <= decision["high"]:
            return "supported"
        return "contradicted" if high < decision["low"] or low > decision["high"] else "inconclusive"
    if _holds(decision, low) and _holds(decision, high):
        return "supported"
    return "contradicted" if not _holds(decision, low) and not _holds(decision, high) else "inconclusive"


def is_borderline(decision: dict, value: float, low: float, high: float) -> bool:
    """Whether the estimate sits within one standard error (the 95 % interval's width / 3.92) of the
    decision's threshold (of the nearer bound of a band)."""
    if math.isnan(low):
        return False
    bounds = [decision["low"], decision["high"]] if decision["op"] == "between" else [decision["threshold"]]
    return min(abs(value - bound) for bound in bounds) < (high - low) / 3.92


def with_specificity(row: dict, claim: dict, measured: dict[str, dict]) -> dict:
    """The row with its rule's specificity (specificity.json) and the gate on "supported": a
    verdict whose rule also passes the claim's absence more than NULL_SUPPORT_MAX of the time, whose
    absence was not simulated, or which passes an exact reproduction of the paper less than SIZE_MIN of
    the time, is `consistent`, on this profile's results and on the paper's numbers."""
    entry = measured.get(claim["claim_id"])
    if entry is None or entry["rule_hash"] != rule_hash(claim):
        entry = {"size": math.nan, "null_support": None, "reversed_support": None,
                 "specificity_note": "not measured for this rule (python -m hnclip.claims.specificity)"}
    null = math.nan if entry["null_support"] is None else entry["null_support"]
    size = entry["size"]
    out = {**row, "size": size, "null_support": null,
           "reversed_support": math.nan if entry["reversed_support"] is None else entry["reversed_support"],
           "specificity_note": entry["specificity_note"]}
    if null <= NULL_SUPPORT_MAX and size >= SIZE_MIN:  # False for NaN: not measured
        return out
    if math.isnan(null):
        why = f"its specificity is not measured: {entry['specificity_note']}"
    elif null > NULL_SUPPORT_MAX:
        why = f"the rule also says supported in {null:.0%} of simulated reproductions without the effect"
    else:
        why = f"the rule says supported in only {size:.0%} of simulated exact reproductions of the paper"
    if out.get("paper_verdict") == "supported":
        out["paper_verdict"] = "consistent"
    if out["verdict"] == "supported":
        out["verdict"] = "consistent"
        out["reason"] = "; ".join(r for r in (out["reason"], f"consistent, not supported: {why}") if r)
    return out


def unavailable_verdict(exc: CellUnavailable) -> str:
    """The verdict of a claim whose statistic could not read a cell."""
    return "not_implemented" if exc.status == NOT_IMPLEMENTED else "not_testable"


def judge_claim(claim: dict, source, conditions: dict, boot: Bootstrap, model: TieModel | None = None) -> dict:
    """One row of the scorecard (`conditions`: name -> Condition or bool, see profile_conditions). A claim
    whose ties are not resolved yet (hnclip.claims.tie.resolved) takes `model`'s, by default the paper's
    test sizes'."""
    if "tie" not in claim:
        claim = resolved(claim, model or paper_model(measured_correlation()))
    decision = claim_decision(claim, as_condition(conditions.get("real_data")).met)
    tolerance = claim.get("tie")
    row = {"claim_id": claim["claim_id"], "quote": claim["quote"], "paper_value": claim["paper_value"],
           "reproduced_value": math.nan, "ci_low": math.nan, "ci_high": math.nan, "evidence": "",
           "decision": decision_text(decision, tolerance), "reason": "", "where": claim["where"],
           "tolerance": tolerance, "sanity_check": bool(claim.get("sanity_check")),
           "requires": ", ".join(claim.get("requires", {})), "group": claim.get("group", "paper"),
           "group_reason": claim.get("group_reason", ""), "borderline": False}
    failed, unmeasured = unmet_preconditions(claim, conditions)
    real_data = as_condition(conditions.get("real_data")).met
    if real_data and unmeasured:  # real runs: a comparison is judged only where its regime was measured
        failed += [f"precondition `{name}` ({REGIME_CONDITIONS.get(name, ('', name))[1]}) not measured on this "
                   f"profile: {as_condition(conditions.get(name)).detail or 'no value'}" for name in unmeasured]
        unmeasured = []
    if failed:
        return {**row, "verdict": "not_testable", "reason": "; ".join(failed)}
    source.evidence = []
    try:
        draws = statistic_draws(claim["statistic"], source)
    except CellUnavailable as exc:
        return {**row, "verdict": unavailable_verdict(exc), "reason": str(exc),
                "evidence": format_evidence(source.evidence)}
    value, low, high = summarise(draws, boot)
    row["borderline"] = is_borderline(decision, value, low, high)
    notes = [] if not math.isnan(low) else [f"no interval: {source.no_interval(claim['statistic'])}"]
    notes += [f"precondition `{name}` not measured on this profile" for name in unmeasured]
    return {**row, "reproduced_value": value, "ci_low": low, "ci_high": high,
            "verdict": decide(decision, value, low, high), "reason": "; ".join(notes),
            "evidence": format_evidence(source.evidence)}


def paper_judgement(claim: dict, conditions: dict | None = None) -> dict:
    """The claim on the paper's own numbers: its printed tables where they feed the statistic, else the
    number its text states (`paper_number`); not_testable where the paper gives neither.
    Returns {paper_verdict, paper_statistic, paper_reason, paper_borderline}. Ties at the paper's test sizes.

    The paper's numbers have no interval; its verdict is marked borderline where one standard error of a
    contrast at its test sizes (hnclip.claims.tie) decides it: a rule with a tie whose verdict differs with
    the tie one standard error narrower or wider, or a sign or magnitude of R@1 points within one standard
    error of its threshold."""
    model = paper_model(measured_correlation())
    resolved_claim = resolved(claim, model) if "tie" not in claim else claim
    row = judge_claim(resolved_claim, PaperSource(), conditions or paper_conditions(), Bootstrap())
    if row["verdict"] in ("supported", "contradicted"):
        return {"paper_verdict": row["verdict"], "paper_statistic": row["reproduced_value"],
                "paper_reason": "its printed tables",
                "paper_borderline": _paper_borderline(claim, resolved_claim, row, model, conditions)}
    number = claim.get("paper_number")
    if number is None:
        return {"paper_verdict": "not_testable", "paper_statistic": math.nan,
                "paper_reason": f"the paper states no number for it ({row['reason']})", "paper_borderline": False}
    decision = claim_decision(resolved_claim, real_data=True)
    return {"paper_verdict": decide(decision, float(number), math.nan, math.nan), "paper_statistic": float(number),
            "paper_reason": "the number its text states", "paper_borderline": False}


def _paper_borderline(claim: dict, resolved_claim: dict, row: dict, model: TieModel, conditions) -> bool:
    """Whether one standard error of a contrast at the paper's test sizes moves the paper's verdict."""
    if resolved_claim.get("tie"):  # the verdict with every tie one standard error narrower and wider
        verdicts = {judge_claim(resolved(claim, model, Z_TIE + step), PaperSource(),
                                conditions or paper_conditions(), Bootstrap())["verdict"] for step in (-1.0, 1.0)}
        return len(verdicts) > 1
    decision = claim_decision(resolved_claim, real_data=True)
    if decision["op"] == "between" or not claim_benchmarks(claim) or \
            str(claim["statistic"].get("reduce")).startswith("count"):
        return False  # not a difference of R@1 points against its threshold
    return abs(row["reproduced_value"] - decision["threshold"]) < model.tie(claim) / Z_TIE


def _self_consistent(verdict: str):
    return {"supported": True, "consistent": True, "contradicted": False}.get(verdict)


def scorecard(reg: Registry, boot: Bootstrap, model: TieModel | None = None) -> pd.DataFrame:
    """Every claim judged on this profile's results and on the paper's own numbers (SCORECARD_COLUMNS), the
    ties and the seed term of `model` (default: this profile's, hnclip.claims.tie.profile_model)."""
    model = model or profile_model(reg)
    source, conditions = ReproducedSource(reg, boot, model.seed_sd), profile_conditions(reg)
    on_paper = paper_conditions(reg.params.get("regime_targets"))
    rows, measured = [], rule_specificity()
    for claim in claim_definitions():
        paper = paper_judgement(claim, on_paper)
        judged = judge_claim(claim, source, conditions, boot, model)
        row = with_specificity({**judged, "paper_verdict": paper["paper_verdict"],
                                "paper_number": paper["paper_statistic"],
                                "paper_borderline": paper["paper_borderline"]}, claim, measured)
        rows.append({**row, "paper_self_consistent": _self_consistent(row["paper_verdict"])})
    return pd.DataFrame(rows).reindex(columns=SCORECARD_COLUMNS)
