# Effects (each table's contrasts, paper vs reproduced with 95 % bootstrap intervals) and the claims
# scorecard (every quantitative claim of the paper judged on this profile), shown first in the report.
from hnclip.claims.definitions import claim_definitions
from hnclip.claims.scorecard import claims_inputs
from hnclip.report.effects import definitions, effects_inputs

BOOTSTRAP = canonical_json(config.get("bootstrap", {}))  # resamples, seed, confidence (defaults in the code)
# The claims and contrasts are package data (src/hnclip/claims/claims.yaml, src/hnclip/report/contrasts.yaml):
# an edit reruns what it changes. Input functions and claims_targets (rule all): workflow/rules/common.smk.


rule effects:
    input:
        lambda w: [str(p) for p in effects_inputs(REG, w.table)],
    output:
        csv="results/effects/{table}.csv",
        md=report("results/effects/{table}.md", caption="../report/effects.rst",
                  category=lambda w: report_section("tables", w.table), subcategory="Effects",
                  labels={"effects": "{table}"}),
        provenance="results/effects/{table}.provenance.json",
    params:
        bootstrap=BOOTSTRAP,
        contrasts=lambda w: canonical_json(definitions().get("contrasts", {}).get(w.table, {})),
    log:
        f"logs/{PROFILE}/effects/{{table}}.log",
    benchmark:
        f"logs/{PROFILE}/effects/{{table}}.benchmark.tsv"
    shell:
        f"{HNCLIP} effects {{wildcards.table}} > {{log}} 2>&1"


rule step_timing:
    # The timing claims' controlled measurement: the timing table's runs take optimizer steps on the same
    # distinct batches, each at its own compute batch (alone on a GPU). It takes every core, so no other job of
    # this workflow shares the machine while it runs.
    input:
        step_timing_inputs,
    output:
        "results/stats/step_timing.json",
    params:
        plan=lambda w: canonical_json(REG.paired_timing()),
        specs=lambda w: canonical_json({row: REG.run(run).canonical()
                                        for row, run in (REG.paired_timing() or {}).get("runs", {}).items()}),
    log:
        f"logs/{PROFILE}/stats/step_timing.log",
    benchmark:
        f"logs/{PROFILE}/stats/step_timing.benchmark.tsv"
    threads: workflow.cores
    resources:
        gpu=USES_GPU,
        mem_mb=MEM_MB["train"],
        runtime=planned_runtime("step_timing", "paired"),
    shell:
        f"{HNCLIP} step-timing > {{log}} 2>&1"


rule claims:
    input:
        [str(p) for p in claims_inputs(REG)],
    output:
        csv="results/claims.csv",
        # "0 ..." sorts before every paper section in the report's menu
        md=report("results/claims.md", caption="../report/claims.rst", category="0 Claims scorecard",
                  subcategory="Scorecard", labels={"scorecard": "claims"}),
        provenance="results/claims.provenance.json",
    params:
        bootstrap=BOOTSTRAP,
        # a function: Snakemake would read braces in the claims' quoted text (e.g. "{0.75, 1}") as wildcards
        claims=lambda w: canonical_json(claim_definitions()),
    log:
        f"logs/{PROFILE}/claims.log",
    benchmark:
        f"logs/{PROFILE}/claims.benchmark.tsv"
    shell:
        f"{HNCLIP} claims > {{log}} 2>&1"
