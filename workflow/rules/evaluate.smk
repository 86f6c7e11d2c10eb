# Recall@K of one run on one benchmark: best epoch (from the per-epoch record) and last epoch
# (re-encoded from the final weights and checked against the training record). A transfer benchmark
# (not evaluated while training) encodes the checkpoint selected on the run's own benchmark
# (model_selected.pt) as its best. The zero-shot pseudo-run evaluates the initial backbone as released.


rule evaluate:
    input:
        unpack(evaluate_inputs),
    output:
        "results/evals/{run}/{benchmark}.json",
    params:
        evaluation=canonical_json(config["evaluation"]),
    log:
        "logs/evals/{run}/{benchmark}.log",
    benchmark:
        "logs/evals/{run}/{benchmark}.benchmark.tsv"
    threads: EXECUTION["threads"]
    resources:  # a GPU slot and the model's memory only where it encodes
        gpu=evaluation_gpu,
        mem_mb=evaluation_mem_mb,
        runtime=planned_runtime("evaluate", "{run}/{benchmark}"),
    shell:
        f"{HNCLIP} --threads {{threads}} evaluate --run {{wildcards.run}} --benchmark {{wildcards.benchmark}} > {{log}} 2>&1"
