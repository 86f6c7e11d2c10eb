# Statistics of the gradient-dynamics figures (paper Fig. 4, Fig. A8) from their runs' probe logs:
# results/stats/<figure>.json, which the figure draws its bands and its caption from.
# GRADIENT_FIGURES, the input functions and figure_caption (rule figure's report caption): workflow/rules/common.smk.


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
