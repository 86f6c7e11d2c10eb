# Tables (Markdown, LaTeX, CSV + provenance) and figures (PNG + PDF) from evaluation records.


rule table:
    input:
        table_inputs,
    output:
        md=report("results/tables/{table}.md", category="Tables", labels={"table": "{table}"}),
        tex="results/tables/{table}.tex",
        csv="results/tables/{table}.csv",
        provenance="results/tables/{table}.provenance.json",
    params:
        spec=lambda w: canonical_json({"profile": PROFILE, "table": config["tables"][w.table],
                                       "seeds": REG.profile["seeds"]}),
    log:
        f"logs/{PROFILE}/tables/{{table}}.log",
    shell:
        f"{HNCLIP} table {{wildcards.table}} > {{log}} 2>&1"


rule figure:
    input:
        csv="results/tables/{table}.csv",
    output:
        png=report("figures/{table}_{figure}.png", category="Figures", labels={"table": "{table}"}),
        pdf="figures/{table}_{figure}.pdf",
    log:
        f"logs/{PROFILE}/figures/{{table}}_{{figure}}.log",
    shell:
        f"{HNCLIP} figure {{wildcards.table}} > {{log}} 2>&1"
