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
    threads: workflow.cores  # runs alone at the head of the DAG
    resources:
        gpu=USES_GPU,
    shell:
        f"{HNCLIP} --threads {{threads}} pretrain --backbone {{wildcards.backbone}} > {{log}} 2>&1"


rule download_longclip:
    output:
        weights=f"{DATA_ROOT}/longclip_l/raw/longclip-L.pt",
    log:
        f"logs/{PROFILE}/data/longclip_l.log",
    shell:
        f"{HNCLIP} --threads {{threads}} download longclip_l > {{log}} 2>&1"
