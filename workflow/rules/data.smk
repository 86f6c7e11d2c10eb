# Datasets: generated (embedded profile) or downloaded and converted to manifests (paper profile).


rule dataset:
    output:
        marker=f"{DATA_ROOT}/{{dataset}}/dataset.json",
    params:
        spec=lambda w: canonical_json(with_generator_digest(dataset_generation(REG, w.dataset))),
    log:
        f"logs/{PROFILE}/data/{{dataset}}.log",
    shell:
        f"{HNCLIP} data {{wildcards.dataset}} > {{log}} 2>&1"
