"""The scorecard as Markdown (results/claims.md): the counts on this profile and on the paper's own
numbers, the regime preconditions, the verdicts' legend, one table row per claim and its evidence."""
from __future__ import annotations

import math

import pandas as pd

from hnclip.claims.definitions import NULL_SUPPORT_MAX, SIZE_MIN, SPECIFICITY_FILE, claim_definitions
from hnclip.claims.preconditions import REGIME_CONDITIONS, as_condition, profile_conditions
from hnclip.claims.quotes import readable_quote
from hnclip.claims.tie import Z_TIE, TieModel
from hnclip.claims.verdicts import GROUPS, VERDICT_MEANINGS, VERDICTS
from hnclip.config.registry import Registry
from hnclip.evaluation.bootstrap import Bootstrap
from hnclip.io import read_json


def _format_number(value: float, count: bool) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if math.isinf(value):
        return "never"
    return f"{value:.0f}" if count else f"{value:.3g}" if abs(value) < 10 else f"{value:.2f}"


def _verdict_counts(verdicts: pd.Series, names=VERDICTS) -> str:
    counts = verdicts.value_counts()
    return ", ".join(f"{int(counts.get(v, 0))} {v.replace('_', ' ')}" for v in names)


def _conditions_text(conditions: dict) -> list[str]:
    out = []
    for name, (_, meaning) in REGIME_CONDITIONS.items():
        condition = as_condition(conditions.get(name))
        state = {True: "holds", False: "**does not hold**", None: "not measured"}[condition.met]
        out.append(f"* `{name}` ({meaning}): {state} — {condition.detail}")
    return out


# The paper's own numbers are never `not_implemented`: its counts list the other verdicts.
PAPER_VERDICTS = tuple(v for v in VERDICTS if v != "not_implemented")


def _parts(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The headline's parts: the paper's claims, our additional checks and, apart, the sanity checks (which
    hold nearly by construction)."""
    sanity = frame["sanity_check"].astype(bool)
    group = frame["group"].fillna("paper")
    return {"of the paper's claims": frame[~sanity & (group == "paper")],
            "additional checks": frame[~sanity & (group == "additional")], "sanity checks": frame[sanity]}


def _header(reg: Registry, frame: pd.DataFrame, boot: Bootstrap, conditions: dict, model: TieModel | None) -> list[str]:
    """The counts, the preconditions, how the claims are judged and the verdicts' legend."""
    s = boot.settings
    contradicted = frame.loc[frame["paper_verdict"] == "contradicted", "claim_id"].tolist()
    parts = _parts(frame)
    out = ["# Claims scorecard", "",
           f"Profile `{reg.profile_name}`: " + "; ".join(f"{len(part)} {name} — {_verdict_counts(part['verdict'])}"
                                                       for name, part in parts.items()) + ".", "",
           "On the paper's own printed numbers, by the same rules: "
           + "; ".join(f"{name} — {_verdict_counts(part['paper_verdict'], PAPER_VERDICTS)}"
                       for name, part in parts.items())
           + (f"; the paper's own numbers contradict {', '.join(f'`{c}`' for c in contradicted)}." if contradicted
              else "."), "",
           "Regime preconditions of this profile (results/stats/regime.json; a claim that requires one that does "
           "not hold is not testable here):", "", *_conditions_text(conditions), "",
           "Each claim of the paper is a computable statistic over this profile's tables and records "
           f"(src/hnclip/claims/claims.yaml), with a {s.confidence:.0%} percentile bootstrap interval over test "
           f"queries (and seeds; paired across runs on the same queries; {s.resamples} resamples, seed {s.seed}). "
           "A single-seed run's interval also carries the between-seed spread (below). "
           "\"Lead or tie\" rules take a tie tolerance from one formula, never a hand value "
           "(docs/results.md, \"The tie tolerance\"): " + (_tie_text(model) if model else "see the tolerance column")
           + "; a closeness or a magnitude the paper states is judged within twice it. Sanity checks hold nearly "
           "by construction (L_HN is L_CLIP on logits shifted by γG ≥ 0) and are judged per run.", "",
           "Each rule was also run on simulated reproductions at the paper's test sizes "
           "(src/hnclip/claims/specificity.json): how often it says supported when the paper is reproduced "
           "exactly (exact), in the world the rule is meant to deny (null: an \"all K\" claim with one item at no "
           "effect, a best-of claim with the runner-up equal on the compared column, a trajectory one step out of "
           "shape, a claim of closeness on its own bound, a timing ratio on its threshold under a drifting load) and "
           "one R@1 point further against the claim (reversed), all at one between-run correlation. "
           "A rule whose null share is above 10 %, or not measured, cannot tell "
           "the claim from its absence: its \"supported\" is reported as **consistent**. A verdict whose estimate is "
           "within one standard error of the decision's threshold is marked (borderline); on the paper's numbers, "
           "which have no interval, one where a contrast's standard error at its test sizes would move the "
           "verdict.", "", *_sensitivity_lines(frame)]
    out += [f"* **{v.replace('_', ' ')}**: {meaning}" for v, meaning in VERDICT_MEANINGS.items()]
    if reg.profile_name != "paper":
        out += ["", "> The embedded miniature tests directions of effect; claims about the real benchmarks' magnitudes "
                    "are not testable on it."]
    return out


def _sensitivity_lines(frame: pd.DataFrame) -> list[str]:
    """How many of the paper's claims the gate lets be supported if the between-run correlation were each of
    specificity.json's sensitivity values (the rules' sizes and null shares measured there; the ties and the
    estimates unchanged), on this profile and on the paper's numbers."""
    if not SPECIFICITY_FILE.is_file():
        return []
    data = read_json(SPECIFICITY_FILE)
    varied, measured = data.get("sensitivity") or {}, data.get("claims", {})
    if not varied:
        return []
    paper = _parts(frame)["of the paper's claims"]
    texts = []
    for rho, entries in sorted(varied.items(), key=lambda item: float(item[0])):
        def passes(claim_id: str) -> bool:
            entry = entries.get(claim_id) or measured.get(claim_id) or {}
            null, size = entry.get("null_support"), entry.get("size")
            return null is not None and size is not None and null <= NULL_SUPPORT_MAX and size >= SIZE_MIN
        # "consistent" is only ever the gate's: before it, these verdicts were "supported"
        counts = [sum(v in ("supported", "consistent") and passes(c) for v, c in zip(paper[column], paper["claim_id"]))
                  for column in ("verdict", "paper_verdict")]
        texts.append(f"at ρ = {rho}: {counts[0]} supported on this profile, {counts[1]} on the paper's numbers")
    return [f"Sensitivity to the between-run correlation (measured ρ = {data['settings']['correlation']:g}; the "
            "paper's claims that the gate lets be supported with each rule's size and null share measured at another "
            "ρ): " + "; ".join(texts) + ".", ""]


def _share(value) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.0%}"


def _rule_passes(rec: dict) -> str:
    """How often the rule says supported: exact reproduction / effect absent / reversed by a point."""
    if all(_share(rec.get(k)) == "–" for k in ("size", "null_support", "reversed_support")):
        return f"– ({rec.get('specificity_note') or 'not measured'})"
    text = f"{_share(rec.get('size'))} / {_share(rec.get('null_support'))} / {_share(rec.get('reversed_support'))}"
    note = rec.get("specificity_note")
    return text + (f" ({note})" if isinstance(note, str) and note else "")


def _claim_row(rec: dict, spec: dict) -> str:
    """A scorecard row's table line (`spec`: the claim's definition)."""
    count = str(spec["statistic"].get("reduce", "")).startswith("count")
    reproduced = _format_number(rec["reproduced_value"], count)
    if not math.isnan(rec["ci_low"]):
        reproduced += f" [{_format_number(rec['ci_low'], count)}, {_format_number(rec['ci_high'], count)}]"
    on_paper = rec["paper_verdict"].replace("_", " ") + (" (borderline)" if rec.get("paper_borderline") is True else "")
    if not (isinstance(rec["paper_number"], float) and math.isnan(rec["paper_number"])):
        on_paper = f"{_format_number(rec['paper_number'], count)}: {on_paper}"
    label = "sanity check; " if rec["sanity_check"] else ""
    claim = f"**{rec['claim_id']}** ({label}{rec['where']}): “{readable_quote(rec['quote'])}”"
    if isinstance(rec.get("group_reason"), str) and rec["group_reason"]:
        claim += f" — why it is ours: {rec['group_reason']}"
    verdict = rec["verdict"].replace("_", " ") + (" (borderline)" if rec.get("borderline") is True else "")
    cells = [claim, rec["paper_value"], on_paper, reproduced, verdict,
             f"{rec['decision']}: {spec.get('why', '')}", _rule_passes(rec)]
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"  # quotes hold |Δ|


def _tie_text(model: TieModel) -> str:
    sizes = ", ".join(f"{b} {n:,}" for b, n in sorted(model.sizes.items()))
    return (f"{model.describe()}, on this profile's test sets ({sizes} queries): "
            f"{Z_TIE:g} × SE = {Z_TIE * model.standard_error(max(model.sizes.values())):.2f} to "
            f"{Z_TIE * model.standard_error(min(model.sizes.values())):.2f} R@1 points")


def to_markdown(reg: Registry, frame: pd.DataFrame, boot: Bootstrap, conditions: dict | None = None,
                model: TieModel | None = None) -> str:
    """results/claims.md from the scorecard `frame` (`conditions`: this profile's, by default measured)."""
    conditions = conditions if conditions is not None else profile_conditions(reg)
    out = _header(reg, frame, boot, conditions, model)
    specs = {c["claim_id"]: c for c in claim_definitions()}
    group = frame["group"].fillna("paper")
    for key, title in GROUPS.items():
        records = frame[group == key].to_dict("records")
        if not records:
            continue
        out += ["", f"## {title}", "", "| claim | paper | on the paper's numbers | reproduced [95 % CI] | verdict | "
                "decision | rule says supported: exact / null / reversed |", "|---|---|---|---|---|---|---|"]
        out += [_claim_row(rec, specs.get(rec["claim_id"], {"statistic": {}})) for rec in records]
    out += ["", "## Evidence and reasons", ""]
    for rec in frame.to_dict("records"):
        details = [text for text in (rec["reason"], rec["evidence"]) if isinstance(text, str) and text]
        out.append(f"* **{rec['claim_id']}**: " + (" — ".join(details) if details else "–"))
    return "\n".join(out) + "\n"
