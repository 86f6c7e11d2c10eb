# The initial weights every fine-tuning run starts from.


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
    # Its cores are its own (Snakemake reserves them), so its OpenMP threads may spin between
    # parallel regions (faster than hnclip's default passive wait, which matters when jobs share cores).
    shell:
        f"OMP_WAIT_POLICY=ACTIVE {HNCLIP_PLAIN} --threads {{threads}} pretrain --backbone {{wildcards.backbone}} > {{log}} 2>&1"


rule download_longclip:
    output:
        weights=f"{DATA_ROOT}/longclip_l/raw/longclip-L.pt",
    log:
        f"logs/{PROFILE}/data/longclip_l.log",
    benchmark:
        f"logs/{PROFILE}/data/longclip_l.benchmark.tsv"
    shell:
        f"{HNCLIP} --threads {{threads}} download longclip_l > {{log}} 2>&1"
