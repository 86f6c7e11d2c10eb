# The regime the paper's mechanism needs (params.yaml `regime_targets`), measured from the
# pipeline's own outputs: zero-shot R@1, InfoNCE / L_HN saturation shares from the runs' step logs,
# the share of training micro-batches holding two siblings, and the caption geometry (Table A1's
# statistics). results/stats/regime.json (with provenance) and regime.md, shown in the HTML report.
# regime_targets (what rule all adds): workflow/rules/common.smk.
from hnclip.commands.regime import regime_inputs


rule regime:
    input:
        lambda w: regime_inputs(REG),
    output:
        json="results/stats/regime.json",
        # "0 ..." sorts before every paper section in the report's menu (after the claims scorecard)
        md=report("results/stats/regime.md", caption="../report/regime.rst", category="0 Regime preconditions",
                  subcategory="Preconditions", labels={"report": "regime"}),
    params:
        targets=canonical_json(config.get("regime_targets", {})),
    log:
        f"logs/{PROFILE}/stats/regime.log",
    benchmark:
        f"logs/{PROFILE}/stats/regime.benchmark.tsv"
    shell:
        f"{HNCLIP} regime > {{log}} 2>&1"
