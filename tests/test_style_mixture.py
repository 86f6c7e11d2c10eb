"""A caption-style mixture as a generator option (params.yaml `generator: {style: {simple: 0.9, flowing: 0.1}}`):
each family's captions in one grammar drawn by its shares, part of the dataset's fingerprint; datasets that do
not use it are byte-identical to those written before it existed."""
import hashlib
from pathlib import Path

import pytest
import yaml

from hnclip.config.params import validate_params
from hnclip.config.synthetic_spec import dataset_fingerprint, style_of, variant_spec
from hnclip.data.synthetic import split_edits, write_dataset

ROOT = Path(__file__).resolve().parents[1]
SIMPLE_OPENING = "shapes on a"          # the simple grammar's first sentence: "<N> shapes on a <bg> background."


def dataset_hash(out: Path, variant: str, sizes: dict, generator: dict | None) -> str:
    manifests = write_dataset(out, variant, sizes, seed=3, image_size=32, generator=generator)
    digest = hashlib.sha256()
    for split in sorted(manifests):
        digest.update(manifests[split].read_bytes())
    for png in sorted((out / "images").glob("*.png")):
        digest.update(png.read_bytes())
    return digest.hexdigest()[:16]


# Written by the generator before mixtures existed (commit 369dcf6), with these arguments
BEFORE_MIXTURES = [
    ("docci", {"train": 12, "test": 4}, None, "93dd2338a4737115", "d223c101aa1df283"),
    ("docci", {"train": 12, "test": 4}, {"style": "simple", "family_size": 2}, "0f735ad662029b2a", "48697caaf2710d39"),
    ("pretrain", {"train": 12}, {"style": "simple"}, "4ed81a97697e6fd0", "0bf94bc7a1b1b105"),
]


@pytest.mark.parametrize(("variant", "sizes", "generator", "bytes_hash", "fingerprint"), BEFORE_MIXTURES)
def test_datasets_without_a_mixture_are_byte_identical_to_before(tmp_path, variant, sizes, generator, bytes_hash,
                                                                  fingerprint):
    assert dataset_hash(tmp_path / "ds", variant, sizes, generator) == bytes_hash
    assert dataset_fingerprint(variant, sizes, 3, 32, generator)["digest"][:16] == fingerprint


def test_a_mixture_of_one_style_is_that_style(tmp_path):
    sizes = {"train": 12, "test": 4}
    assert style_of({"simple": 1.0}) == "simple"
    assert dataset_hash(tmp_path / "a", "docci", sizes, {"style": {"simple": 1.0}}) == \
        dataset_hash(tmp_path / "b", "docci", sizes, {"style": "simple"})


def test_the_mixture_is_part_of_the_fingerprint_in_one_canonical_order():
    sizes = {"train": 40}
    styles = {"simple": "simple", "mix": {"simple": 0.9, "flowing": 0.1},
              "same_mix_other_order": {"flowing": 0.1, "simple": 0.9},
              "other_shares": {"simple": 0.75, "flowing": 0.25}}
    digest = {name: dataset_fingerprint("pretrain", sizes, 1, 64, {"style": style})["digest"]
              for name, style in styles.items()}
    assert digest["mix"] == digest["same_mix_other_order"]
    assert len({digest["simple"], digest["mix"], digest["other_shares"]}) == 3
    spec = variant_spec("pretrain", {"style": {"flowing": 0.1, "simple": 0.9}})
    assert spec.style == (("flowing", 0.1), ("simple", 0.9))  # CAPTION_STYLE_NAMES order


def test_each_family_is_written_in_one_grammar_drawn_by_the_shares():
    generator = {"style": {"simple": 0.75, "flowing": 0.25}, "family_size": 2}
    rows = split_edits("docci", "train", 800, seed=5, generator=generator)
    by_family: dict[str, set[bool]] = {}
    for row_id, (_, caption) in rows.items():
        family = row_id.rsplit("-m", 1)[0]
        by_family.setdefault(family, set()).add(SIMPLE_OPENING in caption.split(".")[0])
    assert all(len(kinds) == 1 for kinds in by_family.values())  # siblings share their grammar
    simple_share = sum(kinds == {True} for kinds in by_family.values()) / len(by_family)
    assert len(by_family) == 400 and simple_share == pytest.approx(0.75, abs=0.07)
    # the same arguments draw the same families' styles
    assert split_edits("docci", "train", 800, seed=5, generator=generator) == rows


@pytest.mark.parametrize(("style", "message"), [
    ({"simple": 0.6, "flowing": 0.3}, "must sum to 1"),
    ({"simple": 1.2, "flowing": -0.2}, "positive number"),
    ({"simple": 0.5, "sonnet": 0.5}, "unknown caption style(s) ['sonnet']"),
    ({}, "a name or a mixture"),
    ("sonnet", "unknown caption style 'sonnet'"),
])
def test_a_malformed_mixture_is_refused_with_the_reason(style, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        variant_spec("docci", {"style": style})


def test_the_schema_accepts_a_mixture_and_refuses_an_unknown_style():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    pretrain = params["backbones"]["tiny_pretrained"]["pretrain"]
    pretrain["generator"] = {"style": {"simple": 0.9, "flowing": 0.1}}
    validate_params(params)
    pretrain["generator"] = {"style": {"simple": 0.9, "sonnet": 0.1}}
    with pytest.raises(Exception, match="sonnet"):
        validate_params(params)
