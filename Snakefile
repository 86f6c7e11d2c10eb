# hnclip-repro: the paper's experiments as one DAG. This file is a table of contents;
# the rules live in workflow/rules/, and every rule is a thin call of the `hnclip` CLI.
#
#   snakemake --cores all                         # every table of the active profile (params.yaml)
#   snakemake --cores all --config profile=paper  # the paper-scale profile
#   snakemake results/tables/table3a.md           # one table; see docs/pipeline.md for single cells

configfile: "params.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/image_cache.smk"
include: "workflow/rules/backbone.smk"
include: "workflow/rules/auxiliary.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/gradient_stats.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/claims.smk"
include: "workflow/rules/regime.smk"


rule all:
    input:
        all_targets(),
    default_target: True
