"""The regime the paper's mechanism needs (issue 13), as measured values checked against targets:
a strong zero-shot backbone, InfoNCE saturating under plain fine-tuning while L_HN does not, few
micro-batches holding two near-duplicate siblings, uniformly similar captions, and headroom (plain
fine-tuning improves on the zero-shot backbone, so a fine-tuning gain can show at all). Pure functions
over records already read; `hnclip.commands.regime` reads the pipeline's outputs and writes the report.

A check is one measured value against its target (`met` is None when nothing could be measured:
not applicable on the profile, or not planned by its tables); a precondition holds when every
measured check does, and is None when none was measured.
"""
from __future__ import annotations

import operator
from typing import Iterable

from hnclip.report.render import markdown_table

COMPARISONS = {">=": operator.ge, "<=": operator.le}
SYMBOLS = {">=": "≥", "<=": "≤"}


def check(item: str, value: float | None, op: str, threshold: float, source: str | None, note: str = "") -> dict:
    """One measured value against its target `op threshold` (op: ">=" or "<=")."""
    if op not in COMPARISONS:
        raise ValueError(f"unknown comparison {op!r}; allowed values: {sorted(COMPARISONS)}")
    met = None if value is None else bool(COMPARISONS[op](value, threshold))
    return {"item": item, "value": value, "op": op, "threshold": threshold, "target": f"{op} {threshold:g}",
            "met": met, "source": source, "note": note}


def all_met(verdicts: Iterable[bool | None]) -> bool | None:
    """True when every measured verdict holds, False when one fails, None when none was measured."""
    measured = [v for v in verdicts if v is not None]
    return all(measured) if measured else None


def precondition(key: str, title: str, checks: list[dict]) -> dict:
    return {"key": key, "title": title, "met": all_met(c["met"] for c in checks), "checks": checks}


def sibling_batch_share(batches: list[list[int]], families: list[str | None]) -> float | None:
    """Share of `batches` (rows of a manifest) holding at least two rows of one family; None when
    the manifest's rows carry no family (real data), so the question does not apply."""
    if not batches:
        raise ValueError("no batches: the training set is smaller than one micro-batch")
    if any(family is None for family in families):
        return None
    with_siblings = sum(len({families[i] for i in batch}) < len(batch) for batch in batches)
    return with_siblings / len(batches)


def epoch_share(steps: list[dict], epoch: int, field: str) -> float | None:
    """One epoch's share of micro-batches from the steps log, where each optimizer step logs `field`
    as the share among its own micro-batches: steps weighted by their `micro_batches` (a short last
    accumulation group counts less; a log written before that field weighs steps equally). None when
    the epoch is not in the log or its steps do not log `field`."""
    rows = [step for step in steps if step["epoch"] == epoch]
    if not rows or any(field not in step for step in rows):
        return None
    weights = [step.get("micro_batches", 1) for step in rows]
    return sum(w * step[field] for w, step in zip(weights, rows, strict=True)) / sum(weights)


def epoch_summary_share(history: list[dict], epoch: int, key: str) -> float | None:
    """The same share from the training record's per-epoch summary (`train.json` history: e.g.
    `hn_saturated_frac` over all the epoch's micro-batches); None when not recorded."""
    for entry in history:
        if entry["epoch"] == epoch:
            return entry.get("train", {}).get(key)
    return None


def _value(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"


def _verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("yes" if met else "no")


def render_saturation_by_epoch(rows: list[dict], threshold: float) -> list[str]:
    """The share of micro-batches with InfoNCE below `threshold` (plain fine-tuning) and with L_HN at or above
    it (the L_HN run), one column per epoch."""
    epochs = sorted({int(e) for row in rows for e in row["by_epoch"]})
    table = [[f"{row['measure']} ({row['method']})",
              *(_value(row["by_epoch"].get(e, row["by_epoch"].get(str(e)))) for e in epochs)] for row in rows]
    return [f"## Saturation by epoch (threshold {threshold:g})", "",
            "Share of each epoch's micro-batches (from the runs' step logs).", "",
            *markdown_table(["run", *(f"epoch {e}" for e in epochs)], table)]


def render_markdown(report: dict) -> str:
    """results/stats/regime.md: the verdicts first, then one row per check."""
    lines = [f"# Regime preconditions (profile `{report['profile']}`)", "",
             "Does this profile reproduce the regime the paper's mechanism needs? Each measured value against "
             "its target (params.yaml `regime_targets`); n/a: not applicable on this profile or not measured "
             f"(see the note). Loss shares use the training loop's threshold {report['saturation_threshold']:g}.",
             "", f"**All preconditions met: {_verdict(report['all_met'])}**", ""]
    verdicts = [[p["title"], _verdict(p["met"])] for p in report["preconditions"]]
    lines += markdown_table(["precondition", "met"], verdicts)
    rows = [[p["title"], c["item"], _value(c["value"]), f"{SYMBOLS[c['op']]} {c['threshold']:g}", _verdict(c["met"]),
             f"`{c['source']}`" if c["source"] else "", c["note"]]
            for p in report["preconditions"] for c in p["checks"]]
    lines += ["", *markdown_table(["precondition", "measured", "value", "target", "met", "source", "note"], rows)]
    if report.get("saturation_by_epoch"):  # a diagnostic beside the epoch-1 shares
        lines += ["", *render_saturation_by_epoch(report["saturation_by_epoch"], report["saturation_threshold"])]
    if report.get("edit_kinds"):  # a diagnostic beside the preconditions: which details the models perceive
        from hnclip.report.edit_kinds import render_section
        lines += ["", *render_section(report["edit_kinds"])]
    lines += ["", "Provenance (inputs and their sha256, code version): `results/stats/regime.json`.", ""]
    return "\n".join(lines)
