"""The rehearsal's source table: every file of the real table (`hnclip.data.sources`), under the same
source and file names, pinned to the rehearsal's own miniatures (`hnclip.rehearsal.mirror`).

Only a profile with `source_table: rehearsal` (params.yaml, `paper_rehearsal`) reads this table; the
real table's pins are never touched, and a miniature offered to the paper profile fails its checksum.
Files here have no URL of their own: they come from a mirror (HNCLIP_MIRROR), which the rehearsal
command serves on loopback, or, for the hand-placed SA-1B shard, from where the command puts it.

The pins are the sha256 and size of the files `build_mirror` writes; they change only when the
mirror's builders, the synthetic generator or a library writing the files (Pillow, torch,
transformers) change. `python -m hnclip.rehearsal pins` prints this table anew.
"""
from __future__ import annotations

import functools
from dataclasses import replace

from hnclip.data.sources import SOURCES, Source

REHEARSAL_NOTE = "rehearsal miniature, served by the rehearsal's loopback mirror (python -m hnclip.rehearsal)"

# source -> file name -> (sha256, size in bytes)
REHEARSAL_PINS: dict[str, dict[str, tuple[str, int]]] = {
    'docci': {
        'docci_descriptions.jsonlines': ('0a7a11ad1584d4702c46a022f3177e57af83acf873944c8cd975071f0f6e6ff6', 82493),
        'docci_images.tar.gz': ('13c2d57d69ff9b8c5457b2433e350b7f6a6a46a798c533487da3909198c5c667', 75999),
        'docci_test.json': ('020c98df48154a5b2ffd0f86709558f65b37efb68c8a5eb543e367c97bfe6374', 26015),
    },
    'dci': {
        'dci.tar.gz': ('af888b2e76519b471a3de72a36c917655af06b35f12997b5782a10d7bd36135d', 7311),
        'DCI_test.json': ('112e441d1e36066607b0339de375a6fab4fa2be16286a4d1100b3a65f9745525', 18343),
        'DCI_segment_only_sim_max_del_org.json':
            ('1a561fec44c1fc27c41339a5ea13a9cbc4f2e046f708c3314a6ffbefdcd91700', 25680),
        'sa_000138.tar': ('3fd1fa0166a6a0959181272799af7add1ec9f56544134616c8515106f0824ed9', 317440),
    },
    'urban1k': {
        'Urban1k.zip': ('58f81eb81eff63fe85c7d4b9afa524577fcae25e9a65344420b812efdd390d53', 75865),
    },
    'vg_paragraphs': {
        'paragraphs_v1.json.zip': ('34d2244bc3912a9211acf7a41ece21f7c0ad413f926fb15aa1cd2c1f23fa3e1f', 1806),
        'train_split.json': ('c7d9d6a74020ae4c24ce556d5c0d64abca8a627eddcaa3f5225914835aea32a6', 288),
        'val_split.json': ('05748343971eb6b53aa251a7d75f83a172d5f4211308e90f0dfcc43d850505ff', 36),
        'test_split.json': ('4511f89375022777f04cf75e42e12a894e3a4621eeacfcb38a1128cdd1f434ed', 45),
        'images.zip': ('cfb00edd0848e288f9df9e3cc8db69bd8264abc0cf9c08743dbd137d7d338471', 31215),
        'images2.zip': ('39d4701110b94510aebeac8e3f359a85485ad4fd133fa8f8626ef72f681dbdc2', 29245),
    },
    'longclip_l': {
        'longclip-L.pt': ('ad0018ba5f8b597429dfac8708fd66e1ca6595ae1dea35afb31f809b8cd70aa0', 13388910),
    },
    'sam_vit_huge': {
        'config.json': ('c89f51eeac2e59cbbc974486eaf12ee9a38bd31d6321322e03f0e169512de448', 1394),
        'preprocessor_config.json': ('6edee3f307d50543fb22c3a85e3eab631b14ba85f0b308dce801d8afe76ef2ae', 531),
        'model.safetensors': ('8095fbfe236de905be0499d58cab1980b609bc038dd36bf6d64bb64f2456b36e', 113172),
    },
    'clip_vit_l14_336': {
        'config.json': ('9c6124490348740350471617e8cab59155809947e5ef72af8932092c7309f496', 1062),
        'preprocessor_config.json': ('9c3d961a0117fee492feb755b86d658907a89e3b60296e9cdea06dfc46e9d73d', 463),
        'tokenizer.json': ('3800df9a38f5abc0eb8edd66c3f9f7007c6d046904c213cc6354b3bf7b18d3a1', 3642074),
        'tokenizer_config.json': ('19ae971eb82f84019bebb0bc55efdaa12424ce64e84a640f540680b468276953', 224),
        'vocab.json': ('3f0c4f7d2086b61b38487075278ea9ed04edb53a03cbb045b86c27190fa8fb69', 961143),
        'merges.txt': ('9fd691f7c8039210e0fced15865466c65820d09b63988b0174bfe25de299051a', 524619),
        'special_tokens_map.json': ('841c138373f4f9dd8a6b07a2e4d19b1e62b5364d7e09c41762bab5f7b851eb7f', 133),
        'pytorch_model.bin': ('f65662f26f4620e4577bb82ea60533ec244153fea21221ed406e75e1cf6873a9', 3217553),
    },
}


class RehearsalPinMissing(KeyError):
    pass


@functools.lru_cache(maxsize=1)
def rehearsal_sources() -> dict[str, Source]:
    """The real table with each file's pin, size and origin replaced by the miniature's."""
    table = {}
    for name, source in SOURCES.items():
        pins = REHEARSAL_PINS.get(name, {})
        missing = sorted({f.name for f in source.files} - set(pins))
        if missing:
            raise RehearsalPinMissing(f"the rehearsal table pins no miniature of {name}/{missing}: run "
                                      f"`python -m hnclip.rehearsal pins` and update {__name__}")
        files = tuple(replace(f, checksum=pins[f.name][0], algorithm="sha256", size=pins[f.name][1], url=None,
                              revision=None, hub_repo=None, supersedes=(), note=REHEARSAL_NOTE)
                      for f in source.files)
        table[name] = replace(source, files=files, title=f"{source.title} [rehearsal miniature]")
    return table
