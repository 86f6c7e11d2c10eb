# Recall@K of one run on one benchmark: best epoch (from the per-epoch record) and last epoch
# (re-encoded from the final weights and checked against the training record). The zero-shot
# pseudo-run evaluates the initial backbone as released.


rule evaluate:
    input:
        unpack(evaluate_inputs),
    output:
        "results/evals/{run}/{benchmark}.json",
    params:
        evaluation=canonical_json(config["evaluation"]),
    log:
        "logs/evals/{run}/{benchmark}.log",
    threads: EXECUTION["threads"]
    shell:
        f"{HNCLIP} --threads {{threads}} evaluate --run {{wildcards.run}} --benchmark {{wildcards.benchmark}} > {{log}} 2>&1"
