# Caption geometry of each benchmark's test captions under the initial backbone (Table A1, Fig. 1).


rule caption_stats:
    input:
        backbone=backbone_weights(),
        data=lambda w: test_data(w.benchmark),
        train_data=lambda w: dataset_marker(config["benchmarks"][w.benchmark]["train"]),  # Fig. A5's batch
    output:
        "results/stats/{benchmark}.json",
    log:
        f"logs/{PROFILE}/stats/{{benchmark}}.log",
    benchmark:
        f"logs/{PROFILE}/stats/{{benchmark}}.benchmark.tsv"
    threads: EXECUTION["threads"]
    resources:  # encodes on the profile's device, in a GPU slot
        gpu=USES_GPU,
        mem_mb=MEM_MB["caption_stats"],
        runtime=planned_runtime("caption_stats", "{benchmark}"),
    shell:
        f"{HNCLIP} --threads {{threads}} stats --benchmark {{wildcards.benchmark}} > {{log}} 2>&1"


rule caption_geometry_table:
    input:
        stats=[str(paths.stats(bench)) for bench in config["benchmarks"]],
        train_data=[str(dataset_marker(role)) for role in sorted({b["train"] for b in config["benchmarks"].values()})],
    output:
        md=report(f"results/tables/{CAPTION_GEOMETRY_TABLE}.md", category=GEOMETRY_SECTION, subcategory="Tables",
                  labels={"table": CAPTION_GEOMETRY_TABLE}),
        tex=f"results/tables/{CAPTION_GEOMETRY_TABLE}.tex",
        csv=f"results/tables/{CAPTION_GEOMETRY_TABLE}.csv",
        provenance=f"results/tables/{CAPTION_GEOMETRY_TABLE}.provenance.json",
    log:
        f"logs/{PROFILE}/tables/{CAPTION_GEOMETRY_TABLE}.log",
    benchmark:
        f"logs/{PROFILE}/tables/{CAPTION_GEOMETRY_TABLE}.benchmark.tsv"
    shell:
        f"{HNCLIP} table {CAPTION_GEOMETRY_TABLE} > {{log}} 2>&1"


rule overlap_check:
    # Are Urban-1K's test images (possibly from Visual Genome) in the VG training set? Reported.
    input:
        train=dataset_marker("vg"),
        test=dataset_marker("urban1k"),
    output:
        "results/overlap/vg__urban1k.json",
    log:
        f"logs/{PROFILE}/overlap.log",
    benchmark:
        f"logs/{PROFILE}/overlap.benchmark.tsv"
    threads: EXECUTION["threads"]
    shell:
        f"{HNCLIP} --threads {{threads}} overlap --train vg --test urban1k > {{log}} 2>&1"
