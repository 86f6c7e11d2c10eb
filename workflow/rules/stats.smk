# Caption geometry of each benchmark's test captions under the initial backbone (Table A1, Fig. 1).


rule caption_stats:
    input:
        backbone=backbone_weights(),
        data=lambda w: test_data(w.benchmark),
    output:
        "results/stats/{benchmark}.json",
    log:
        f"logs/{PROFILE}/stats/{{benchmark}}.log",
    threads: EXECUTION["threads"]
    shell:
        f"{HNCLIP} --threads {{threads}} stats --benchmark {{wildcards.benchmark}} > {{log}} 2>&1"
