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
    log:
        f"logs/{PROFILE}/figures/{{figure}}.log",
    shell:
        f"{HNCLIP} figure {{wildcards.figure}} > {{log}} 2>&1"


rule timing_table:
    # Table A3: training cost per method, from the training records of its runs.
    input:
        timing_inputs,
    output:
        md=report(f"results/tables/{TIMING_TABLE}.md", category=TIMING_SECTION, subcategory="Tables",
                  labels={"table": TIMING_TABLE}),
        csv=f"results/tables/{TIMING_TABLE}.csv",
        provenance=f"results/tables/{TIMING_TABLE}.provenance.json",
    params:
        spec=canonical_json(config["derived_tables"][TIMING_TABLE]),
    log:
        f"logs/{PROFILE}/tables/{TIMING_TABLE}.log",
    shell:
        f"{HNCLIP} table {TIMING_TABLE} > {{log}} 2>&1"
