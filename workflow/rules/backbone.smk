# The initial weights every fine-tuning run starts from.

# Its OpenMP wait policy (params.yaml `execution.pretrain_wait_policy`, chosen by
# benchmarks/pretrain_wait_policy.py); unset: PASSIVE, as every other hnclip job.
PRETRAIN_WAIT_POLICY = EXECUTION.get("pretrain_wait_policy", "PASSIVE")


rule pretrain_backbone:
    input:
        data=dataset_marker(PRETRAIN_ROLE),
    output:
        weights="results/backbones/{backbone}/model.pt",
        record="results/backbones/{backbone}/train.json",
        steps="results/backbones/{backbone}/steps.jsonl",
    params:
        spec=lambda w: canonical_json(pretrain_spec(REG, w.backbone)),
    log:
        "logs/backbones/{backbone}.log",
    benchmark:
        "logs/backbones/{backbone}.benchmark.tsv"
    threads: PRETRAIN_THREADS
    resources:
        gpu=USES_GPU,
        mem_mb=PRETRAIN_MEM_MB,
        runtime=planned_runtime("pretrain_backbone", "{backbone}"),
    # Its cores are its own (Snakemake reserves them), so its OpenMP threads may spin between parallel
    # regions (ACTIVE: faster than hnclip's default passive wait when no other process takes a core).
    shell:
        f"OMP_WAIT_POLICY={PRETRAIN_WAIT_POLICY} {HNCLIP_PLAIN} --threads {{threads}} pretrain --backbone {{wildcards.backbone}} > {{log}} 2>&1"


rule download_longclip:
    output:
        weights=f"{DATA_ROOT}/longclip_l/raw/longclip-L.pt",
    params:
        pins=source_pins("longclip_l"),  # a new release pinned in sources.py is fetched, not refused at load
    log:
        f"logs/{PROFILE}/data/longclip_l.log",
    benchmark:
        f"logs/{PROFILE}/data/longclip_l.benchmark.tsv"
    shell:
        f"{HNCLIP} --threads {{threads}} download longclip_l > {{log}} 2>&1"
