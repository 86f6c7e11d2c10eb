# Datasets: generated (embedded profile) or downloaded and converted to manifests (paper profile).


rule download:
    # Real data (paper profile): resumable, checksum-verified download of one source table entry.
    output:
        record=f"{DATA_ROOT}/{{source}}/download.json",
    params:
        pins=lambda w: source_pins(w.source),  # a changed pin (sources.py) verifies the files again
    log:
        f"logs/{PROFILE}/download/{{source}}.log",
    benchmark:
        f"logs/{PROFILE}/download/{{source}}.benchmark.tsv"
    retries: 2
    shell:
        f"{HNCLIP} download {{wildcards.source}} > {{log}} 2>&1"


checkpoint dataset:
    # Manifests of one dataset role: generated (tiny profile) or built from the verified download. A
    # checkpoint: how many shard jobs an auxiliary build has is known only from its training manifest.
    input:
        dataset_inputs,
    output:
        marker=f"{DATA_ROOT}/{{dataset}}/dataset.json",
    params:
        spec=lambda w: canonical_json(with_generator_digest(dataset_generation(REG, w.dataset))),
    log:
        f"logs/{PROFILE}/data/{{dataset}}.log",
    benchmark:
        f"logs/{PROFILE}/data/{{dataset}}.benchmark.tsv"
    resources:
        mem_mb=dataset_mem_mb,
    shell:
        f"{HNCLIP} data {{wildcards.dataset}} > {{log}} 2>&1"


rule subsets:
    # The data-fraction study's nested training subsets (fixed seed, identical for every method).
    input:
        data=lambda w: dataset_marker(w.dataset),
    output:
        f"{DATA_ROOT}/{{dataset}}/subsets.json",
    log:
        f"logs/{PROFILE}/subsets/{{dataset}}.log",
    benchmark:
        f"logs/{PROFILE}/subsets/{{dataset}}.benchmark.tsv"
    shell:
        f"{HNCLIP} subsets {{wildcards.dataset}} > {{log}} 2>&1"
