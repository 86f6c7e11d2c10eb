# Each dataset's images decoded once (execution.image_cache): uint8 arrays at the backbone's input size,
# memory-mapped by every training and evaluation job that reads the dataset (hnclip.data.image_cache).
# train_inputs and evaluate_inputs name them through image_cache_inputs (all three in common.smk);
# without execution.image_cache nothing does.


rule image_cache:
    input:
        data=lambda w: dataset_marker(w.dataset),
    output:
        marker=str(image_cache_marker(DATA_ROOT, "{dataset}")),
    params:
        backbone=BACKBONE_SPEC["model_config"],  # the input size and transform the pixels are made for
    log:
        f"logs/{PROFILE}/image_cache/{{dataset}}.log",
    benchmark:
        f"logs/{PROFILE}/image_cache/{{dataset}}.benchmark.tsv"
    threads: EXECUTION["threads"]  # decoding processes
    resources:
        mem_mb=DATASET_MEM_MB["synthetic"],  # one image per process at a time; the array is written through a map
    shell:
        f"{HNCLIP} --threads {{threads}} image-cache --dataset {{wildcards.dataset}} > {{log}} 2>&1"
