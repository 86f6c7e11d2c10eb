"""The claims scorecard: every quantitative claim of the paper (claims.yaml) judged on this profile's
results, with its 95 % interval, as results/claims.csv and results/claims.md (`build_claims`).

A claim's statistic is computed from "items" (one value per cell, contrast, benchmark, epoch or run,
each as draws: estimate then bootstrap replicates, see hnclip.report.effects) reduced to one number; its
decision (e.g. "count >= 8", "> 0", "between -1 and 1") gives the verdict: supported, contradicted,
inconclusive, not_testable (with the reason) or not_implemented. Counts of "all N" claims take a tie
tolerance from one formula (hnclip.claims.tie: z times the standard error of a paired single-seed
contrast on the profile's test sets, with the between-seed term): an item within it of the decision
counts (hnclip.claims.calibration and hnclip.claims.specificity measure how often each rule passes an
exact reproduction and an absent effect). The same statistics run on the paper's own printed numbers (where the
paper prints no table for it, the number its text states): the `paper_verdict` column, and
`paper_self_consistent` where the paper's own numbers contradict its claim.

One module a job:
  definitions           claims.yaml's claims and the walk over a statistic's tree
  evidence              where the numbers come from: this profile's results, the paper's printed numbers
  statistics            the statistic interpreter (contrast, spread, trajectory, ... reduce)
  probe_statistics      the gradient-probe statistics
  preconditions         real data and the regime preconditions a claim may require
  verdicts              the verdict categories and rules, a claim judged, the scorecard
  tie                   the tie tolerance's formula and the between-seed term
  correlation           the between-run correlation of per-query hits (measured per test set, or the fallback)
  worlds, probe_worlds  the worlds each rule is meant to deny (retrieval cells; probes and caption statistics)
  markdown              the scorecard as Markdown
  scorecard (this module) the files it reads and writes, and their provenance
"""
from __future__ import annotations

import time
from pathlib import Path

from hnclip import provenance
from hnclip.claims.definitions import claim_definitions, statistic_leaves, tables_named
from hnclip.claims.markdown import to_markdown
from hnclip.claims.preconditions import REGIME_CONDITIONS, as_condition, profile_conditions
from hnclip.claims.tie import SEED_TABLE, Z_TIE, claim_correlations, profile_model
from hnclip.claims.verdicts import VERDICTS, scorecard
from hnclip.config import paths
from hnclip.config.registry import Registry
from hnclip.evaluation.bootstrap import Bootstrap, BootstrapSettings
from hnclip.io import write_json, write_text

__all__ = ["CLAIMS_CSV", "CLAIMS_MD", "CLAIMS_PROVENANCE", "VERDICTS", "build_claims", "claims_inputs",
           "evidence_files"]

CLAIMS_CSV = paths.RESULTS / "claims.csv"
CLAIMS_MD = paths.RESULTS / "claims.md"
CLAIMS_PROVENANCE = paths.RESULTS / "claims.provenance.json"


def claims_inputs(reg: Registry) -> list[Path]:
    """Every file the scorecard may read: the tables its claims name (with their evaluations), the
    caption statistics, the timing table, the training records of the probed runs and the regime report."""
    claims = claim_definitions()
    named = set().union(*(tables_named(c["statistic"]) for c in claims))
    tables = [t for t in reg.tables if t in named]
    files = [paths.table(t, ext) for t in tables for ext in ("csv", "provenance.json")]
    files += [paths.evaluation(run, bench) for run, bench in reg.evaluations(tables)]
    files += [paths.stats(b) for b in reg.params["benchmarks"]]
    files += [paths.table(t, "csv") for t, spec in reg.params.get("derived_tables", {}).items()
              if spec["kind"] == "timing" and t in named]
    plan = reg.paired_timing()
    files += [paths.step_timing()] if plan and plan["table"] in named else []
    probed = {s["probe"]["figure"] for c in claims for s in statistic_leaves(c["statistic"]) if "probe" in s}
    files += sorted({paths.run_record(cell.run_id) for name in probed if name in reg.params["figures"]
                     for cell in reg.figure_cells(reg.params["figures"][name])})
    if reg.params.get("regime_targets"):
        files.append(paths.regime_report("json"))
    # the tie tolerance's seed replicates (hnclip.claims.tie.profile_model; its test-set sizes are the zero-shot
    # evaluations', above with their tables)
    files += [paths.table(SEED_TABLE, "csv")] if SEED_TABLE in reg.tables else []
    return list(dict.fromkeys(files))


def build_claims(reg: Registry) -> list[Path]:
    """results/claims.csv, results/claims.md and their provenance record."""
    started = time.time()
    boot = Bootstrap(BootstrapSettings.from_params(reg.params))
    conditions = profile_conditions(reg)
    model = profile_model(reg)
    frame = scorecard(reg, boot, model)
    write_text(CLAIMS_CSV, frame.to_csv(index=False))
    write_text(CLAIMS_MD, to_markdown(reg, frame, boot, conditions, model))
    evidence = {file for text in frame["evidence"] if isinstance(text, str) and text for file in evidence_files(text)}
    inputs = {f"evidence:{f}": f for f in sorted(evidence)} | {f"tie:{f}": f for f in model.read}
    if paths.regime_report("json").is_file() and reg.params.get("regime_targets"):
        inputs["regime"] = paths.regime_report("json")
    record = provenance.record(
        "claims", inputs=inputs, wall_time_s=time.time() - started,
        params={"profile": reg.profile_name, "bootstrap": vars(boot.settings), "claims": claim_definitions()},
        extra={"tie": {"z": Z_TIE, "correlation": model.correlation, "seed_sd": model.seed_sd,
                       "seed_source": model.seed_source, "test_sizes": model.sizes,
                       # the rho each claim's contrasts used: measured from paired per-query hits, or the fallback
                       "correlations": {c["claim_id"]: claim_correlations(c, model) for c in claim_definitions()
                                        if claim_correlations(c, model)}},
               "verdicts": dict(zip(frame["claim_id"], frame["verdict"])),
               "paper_verdicts": dict(zip(frame["claim_id"], frame["paper_verdict"])),
               "preconditions": {name: as_condition(conditions.get(name)).met for name in REGIME_CONDITIONS},
               "outputs": {str(p): provenance.file_sha256(p) for p in (CLAIMS_CSV, CLAIMS_MD)}})
    write_json(CLAIMS_PROVENANCE, record)
    return [CLAIMS_CSV, CLAIMS_MD, CLAIMS_PROVENANCE]


def evidence_files(evidence: str) -> list[str]:
    """The files an `evidence` text names (`file[item]; file; ...`)."""
    return [part.split("[", 1)[0] for part in evidence.split("; ")]
