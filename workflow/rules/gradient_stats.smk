# Statistics of the gradient-dynamics figures (paper Fig. 4, Fig. A8) from their runs' probe logs:
# results/stats/<figure>.json, which the figure draws its bands and its caption from.
from hnclip.config.registry import GRADIENT_FIGURE_KINDS
from hnclip.report.gradient_stats import report_caption, stats_path
from hnclip.commands.gradient_stats import figure_runs

GRADIENT_FIGURES = [name for name, spec in config["figures"].items() if spec["kind"] in GRADIENT_FIGURE_KINDS]


def gradient_stats_inputs(wildcards):
    """The training records of the figure's runs (each probed run writes grad_probe.jsonl beside it)."""
    runs = figure_runs(REG, config["figures"][wildcards.figure])
    return sorted({str(paths.run_record(run["run_id"])) for run in runs})


def gradient_stats_targets():
    return [str(stats_path(name)) for name in GRADIENT_FIGURES]


def figure_caption(wildcards, input):
    """A gradient figure's statistics sentence for the HTML report (empty for other figures). It
    takes `input`, so Snakemake counts it as derived from the inputs: never a reason to rerun."""
    return report_caption(wildcards.figure) if wildcards.figure in GRADIENT_FIGURES else ""


rule gradient_stats:
    input:
        gradient_stats_inputs,
    output:
        "results/stats/{figure}.json",
    wildcard_constraints:
        figure="|".join(GRADIENT_FIGURES) or "(?!)",
    params:
        spec=lambda w: canonical_json(config["figures"][w.figure]),
    log:
        f"logs/{PROFILE}/stats/{{figure}}.log",
    benchmark:
        f"logs/{PROFILE}/stats/{{figure}}.benchmark.tsv"
    shell:
        f"{HNCLIP} gradient-stats {{wildcards.figure}} > {{log}} 2>&1"
