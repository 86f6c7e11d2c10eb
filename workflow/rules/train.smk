# One job per unique run (content-addressed id): cells shared by several tables train once.
# Resume checkpoints live in .cache/checkpoints/<run>/, outside Snakemake's outputs, so a killed
# or failed job restarts from its last checkpoint when rerun.
# A run whose estimate exceeds planning.partition_limit trains in a chain of allocations of whole epochs
# (`hnclip plan` chooses them, Plan.train_parts): each `train_part` job trains through its epoch
# (`--until-epoch E`) and exits after the epoch-end checkpoint; the run's `train` job trains the last epochs
# and writes the outputs. Each allocation is its own job with its own retries: a retry is a failure's,
# never a planned continuation. The parts' markers are temporary: gone once the next allocation has run.
# A changed partition limit changes the allocations of the runs over it, and so their `train` job's inputs:
# Snakemake (rerun-triggers: input) reruns those runs; set the limit before the first run starts.

# Input functions: workflow/rules/common.smk (train_part_marker, previous_train_part).


rule train_part:
    input:
        unpack(train_inputs),
        previous=previous_train_part,
    output:
        temp(train_part_marker("{run}", "{epoch}")),
    params:
        spec=lambda w: REG.run(w.run).canonical(),
    wildcard_constraints:
        epoch=r"\d+",
    log:
        "logs/train/{run}.until-{epoch}.log",
    benchmark:
        "logs/train/{run}.until-{epoch}.benchmark.tsv"
    threads: EXECUTION["threads"]
    resources:
        gpu=USES_GPU * GPUS_PER_RUN,
        mem_mb=MEM_MB["train"],
        runtime=planned_runtime("train_part", "{run}/{epoch}"),
    shell:
        f"{TRAIN_LAUNCHER} --threads {{threads}} train --run-id {{wildcards.run}} --until-epoch {{wildcards.epoch}} "
        f"> {{log}} 2>&1 && touch {{output}}"


rule train:
    input:
        unpack(train_inputs),
        previous=previous_train_part,  # the run's allocations before its last (none within the partition limit)
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
