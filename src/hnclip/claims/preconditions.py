"""Preconditions a claim may `require` (claims.yaml `requires`): `real_data` and the regime preconditions
(REGIME_CONDITIONS), measured on this profile (`profile_conditions`, from the regime report) or on the
paper's own numbers (`paper_conditions`). A claim whose precondition does not hold is not testable."""
from __future__ import annotations

from dataclasses import dataclass

from hnclip.claims.evidence import PaperSource
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.io import read_json


@dataclass(frozen=True)
class Condition:
    """A precondition a claim may `require`: met (None: not measured on this profile) and what was
    measured against which target."""
    met: bool | None
    detail: str = ""


# What a claim's `requires` may name besides `real_data`: the regime report's preconditions behind each.
REGIME_CONDITIONS = {
    "strength": ("zeroshot_r1", "a strong zero-shot backbone"),
    "saturation": ("infonce_saturation", "InfoNCE saturating under plain fine-tuning"),
    "headroom": ("headroom", "plain fine-tuning improving on the zero-shot backbone"),
}


def as_condition(value) -> Condition:
    """A Condition from a Condition, a bool or None (not measured)."""
    return value if isinstance(value, Condition) else Condition(None if value is None else bool(value))


def _measured(check: dict) -> str:
    value = "n/a" if check["value"] is None else f"{check['value']:.3g}"
    return f"{check['item']} {value}"


def regime_conditions(report: dict | None) -> dict[str, Condition]:
    """strength / saturation / headroom from a regime report (results/stats/regime.json); not measured
    where the report or its precondition is missing."""
    out = {}
    for name, (key, _) in REGIME_CONDITIONS.items():
        found = [p for p in (report or {}).get("preconditions", []) if p["key"] == key]
        if not found:
            out[name] = Condition(None, "no regime report (results/stats/regime.json)" if report is None
                                  else f"the regime report has no `{key}`")
            continue
        checks = found[0]["checks"]
        target = checks[0]["target"] if checks else ""
        out[name] = Condition(found[0]["met"], ", ".join(_measured(c) for c in checks) + f" (target {target})")
    return out


def profile_conditions(reg: Registry) -> dict[str, Condition]:
    """What a claim's `requires` may name: `real_data` (every dataset of the profile is the real one)
    and the regime preconditions this profile's regime report measured (REGIME_CONDITIONS)."""
    kinds = sorted({d["kind"] for d in reg.profile["datasets"].values()})
    out = {"real_data": Condition(kinds == ["real"], f"datasets: {', '.join(kinds)}")}
    report = None
    path = paths.regime_report("json")
    if reg.params.get("regime_targets") and path.is_file():
        report = read_json(path)
        if report.get("profile") != reg.profile_name:  # a stale report of another profile is no evidence
            report = None
    return {**out, **regime_conditions(report)}


def paper_conditions(targets: dict | None = None) -> dict[str, Condition]:
    """The same preconditions on the paper's own numbers: zero-shot DOCCI R@1 (Table 1), plain
    fine-tuning − zero-shot (Table A4 − Table 1), first-epoch InfoNCE saturation (Sec. 2.4: 80 %),
    against the regime targets (params.yaml `regime_targets`, or the defaults below)."""
    targets = targets or {}
    zero_min = targets.get("zeroshot_r1", {}).get("min", 40.0)
    head_min = targets.get("headroom", {}).get("min", 5.0)
    sat_min = targets.get("infonce_saturation", {}).get("min", 0.5)
    source = PaperSource()

    def r1(table: str, row: str, direction: str) -> float:
        return float(source.cell(table, row, ("docci", direction, "R@1"), "best")[0])
    zero = {d: r1("table1", "longclip_zeroshot", d) for d in ("t2i", "i2t")}
    gain = {d: r1("tableA4", "longclip_ft", d) - zero[d] for d in ("t2i", "i2t")}
    return {"real_data": Condition(True, "the paper's real benchmarks"),
            "strength": Condition(min(zero.values()) >= zero_min, f"zero-shot DOCCI R@1 {zero['t2i']:.2f} / "
                                  f"{zero['i2t']:.2f} (target >= {zero_min:g})"),
            "saturation": Condition(0.80 >= sat_min, f"80 % of first-epoch batches below 1e-3 (target >= {sat_min:g})"),
            "headroom": Condition(min(gain.values()) >= head_min, f"plain fine-tuning − zero-shot DOCCI R@1 "
                                  f"{gain['t2i']:+.2f} / {gain['i2t']:+.2f} (target >= {head_min:g})")}


def unmet_preconditions(claim: dict, conditions: dict) -> tuple[list[str], list[str]]:
    """(reasons of the failed preconditions, names of those not measured) of a claim's `requires`."""
    failed, unmeasured = [], []
    for name, why in claim.get("requires", {}).items():
        condition = as_condition(conditions.get(name))
        if condition.met is None:
            unmeasured.append(name)
        elif not condition.met:
            if name in REGIME_CONDITIONS:
                failed.append(f"regime precondition `{name}` ({REGIME_CONDITIONS[name][1]}) does not hold: "
                              f"{condition.detail} — {why}")
            else:
                failed.append(why)
    return failed, unmeasured
