# One job per unique run (content-addressed id): cells shared by several tables train once.
# Resume checkpoints live in .cache/checkpoints/<run>/, outside Snakemake's outputs, so a killed
# or failed job restarts from its last checkpoint when rerun.


rule train:
    input:
        unpack(train_inputs),
    output:
        model="results/runs/{run}/model.pt",
        model_selected="results/runs/{run}/model_selected.pt",  # the epoch selected on its own benchmark
        record="results/runs/{run}/train.json",
        steps="results/runs/{run}/steps.jsonl",
    params:
        spec=lambda w: REG.run(w.run).canonical(),
        # Not the run's identity, but what its records contain: the per-epoch metrics (evaluation
        # settings) and whether its gradients are probed. A change reruns the run.
        evaluation=canonical_json(config["evaluation"]),
        grad_probe_every=lambda w: REG.probe_every(w.run),
        grad_probe_precision=EXECUTION.get("grad_probe_precision", "fp32"),
        grad_probe_bf16_every=lambda w: EXECUTION.get("grad_probe_bf16_every", 1) if REG.probe_every(w.run) else None,
        # the released code's cost-only operations (GOAL's double forward): what its timing record measures
        released_costs=lambda w: canonical_json(REG.released_costs(w.run)),
    log:
        "logs/train/{run}.log",
    benchmark:
        "logs/train/{run}.benchmark.tsv"
    threads: EXECUTION["threads"]
    resources:
        gpu=USES_GPU * GPUS_PER_RUN,
        mem_mb=MEM_MB["train"],
        runtime=planned_runtime("train", "{run}"),  # minutes: SLURM's time limit, from `hnclip plan`
    shell:
        f"{TRAIN_LAUNCHER} --threads {{threads}} train --run-id {{wildcards.run}} > {{log}} 2>&1"
