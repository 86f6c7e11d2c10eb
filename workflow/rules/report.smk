# Tables (Markdown, LaTeX, CSV + provenance) and figures (PNG + PDF) from evaluation records.


rule table:
    input:
        table_inputs,
    output:
        md=report("results/tables/{table}.md", caption="../report/table.rst",
                  category=lambda w: report_section("tables", w.table), subcategory="Tables",
                  labels={"table": "{table}"}),
        tex="results/tables/{table}.tex",
        csv="results/tables/{table}.csv",
        provenance="results/tables/{table}.provenance.json",
    params:
        spec=lambda w: canonical_json({"profile": PROFILE, "table": config["tables"][w.table],
                                       "seeds": REG.table_seeds(w.table)}),
    log:
        f"logs/{PROFILE}/tables/{{table}}.log",
    benchmark:
        f"logs/{PROFILE}/tables/{{table}}.benchmark.tsv"
    shell:
        f"{HNCLIP} table {{wildcards.table}} > {{log}} 2>&1"


rule figure:
    input:
        figure_inputs,
    output:
        png=report("figures/{figure}.png", caption="../report/figure.rst",
                   category=lambda w: report_section("figures", w.figure), subcategory="Figures",
                   labels={"figure": "{figure}"}),
        pdf="figures/{figure}.pdf",
    params:
        spec=lambda w: canonical_json(config["figures"][w.figure]),
        caption=figure_caption,
    log:
        f"logs/{PROFILE}/figures/{{figure}}.log",
    benchmark:
        f"logs/{PROFILE}/figures/{{figure}}.benchmark.tsv"
    shell:
        f"{HNCLIP} figure {{wildcards.figure}} > {{log}} 2>&1"


rule timing_table:
    # Table A3: training cost per method, from the training records of its runs.
    input:
        timing_inputs,
    output:
        md=report(f"results/tables/{TIMING_TABLE}.md", category=TIMING_SECTION, subcategory="Tables",
                  labels={"table": TIMING_TABLE}),
        tex=f"results/tables/{TIMING_TABLE}.tex",
        csv=f"results/tables/{TIMING_TABLE}.csv",
        provenance=f"results/tables/{TIMING_TABLE}.provenance.json",
    params:
        spec=canonical_json(config["derived_tables"][TIMING_TABLE]),
    log:
        f"logs/{PROFILE}/tables/{TIMING_TABLE}.log",
    benchmark:
        f"logs/{PROFILE}/tables/{TIMING_TABLE}.benchmark.tsv"
    shell:
        f"{HNCLIP} table {TIMING_TABLE} > {{log}} 2>&1"


rule metrics:
    # Headline numbers (`dvc metrics show/diff`, `dvc exp show`) and the convergence curves as data
    # (`dvc plots show`), with a provenance record beside them.
    input:
        lambda w: [str(p) for p in dvc_metrics.inputs(REG).values()],
    output:
        metrics=str(dvc_metrics.METRICS),
        convergence=str(dvc_metrics.CONVERGENCE),
        provenance=str(dvc_metrics.PROVENANCE),
    params:
        spec=canonical_json({"profile": PROFILE, "seeds": REG.profile["seeds"],
                             "figures": dvc_metrics.convergence_figures(REG)}),
    log:
        f"logs/{PROFILE}/metrics.log",
    benchmark:
        f"logs/{PROFILE}/metrics.benchmark.tsv"
    shell:
        f"{HNCLIP} metrics > {{log}} 2>&1"
