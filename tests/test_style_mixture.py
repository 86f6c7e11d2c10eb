"""A caption-style mixture as a generator option (params.yaml `generator: {style: {simple: 0.9, flowing: 0.1}}`):
each family's captions in one grammar drawn by its shares, part of the dataset's fingerprint; datasets that do
not use it are byte-identical to those written before it existed."""
import hashlib
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from hnclip.config.params import validate_params
from hnclip.config.synthetic_spec import CAPTION_STYLE_NAMES, dataset_fingerprint, style_of, variant_spec
from hnclip.data.synthetic import split_edits, write_dataset
from hnclip.data.synthetic_captions import family_style

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


# The style draw must follow the shares whatever their order in CAPTION_STYLE_NAMES (terse, flowing, regions,
# paragraph, simple), the order the spec holds a mixture in. Drawing from the raw shares instead of their
# cumulative sum is right only when the shares rise in that order, as in {simple: 0.75, flowing: 0.25} above;
# these mixtures have a larger share before a smaller one, where that slip draws far from the shares.
FALLING_MIXTURES = [
    {"flowing": 0.75, "simple": 0.25},                      # the larger share first in grammar order
    {"terse": 0.5, "regions": 0.2, "simple": 0.3},          # three styles, shares falling then rising
    {"flowing": 0.2, "paragraph": 0.5, "simple": 0.3},      # three styles, shares rising then falling
    {"terse": 0.1, "flowing": 0.3, "regions": 0.15, "paragraph": 0.25, "simple": 0.2},  # all five
]
DRAWS = 4000
TOLERANCE_SE = 4.5  # standard errors: a correct draw strays further once in ~150,000 checks


def assert_shares_hold(counts: Counter, mixture: dict[str, float], draws: int):
    """The observed share of every caption style (0 for those outside the mixture) within TOLERANCE_SE binomial
    standard errors of its stated share."""
    assert sum(counts.values()) == draws
    for name in CAPTION_STYLE_NAMES:
        share = mixture.get(name, 0.0)
        tolerance = TOLERANCE_SE * math.sqrt(share * (1 - share) / draws)
        observed = counts[name] / draws
        assert abs(observed - share) <= tolerance, \
            f"{name}: observed share {observed:.4f}, stated {share} (tolerance {tolerance:.4f}) in {mixture}"


@pytest.fixture(scope="module")
def caption_seeds() -> list[np.random.SeedSequence]:
    """Families' caption seeds, spawned as write_dataset spawns them (a family seed's second child)."""
    return [family.spawn(2)[1] for family in np.random.SeedSequence([11, 7]).spawn(DRAWS)]


@pytest.mark.parametrize("mixture", FALLING_MIXTURES, ids=lambda m: "/".join(f"{k}{v}" for k, v in m.items()))
def test_the_style_draw_follows_the_shares_in_any_grammar_order(caption_seeds, mixture):
    spec = style_of(mixture)
    assert [name for name, _ in spec] == [name for name in CAPTION_STYLE_NAMES if name in mixture]
    counts = Counter(family_style(spec, seed) for seed in caption_seeds)
    assert_shares_hold(counts, mixture, DRAWS)


def test_a_dataset_keeps_the_shares_when_the_larger_comes_first_in_grammar_order():
    mixture = {"flowing": 0.75, "simple": 0.25}  # held as ((flowing, 0.75), (simple, 0.25))
    rows = split_edits("docci", "train", 400, seed=5, generator={"style": mixture, "family_size": 1})
    assert len(rows) == 400  # one caption per family
    # no flowing opening starts "<N> shapes on a", so the first sentence tells the two grammars apart
    counts = Counter("simple" if SIMPLE_OPENING in caption.split(".")[0] else "flowing"
                     for _, caption in rows.values())
    assert_shares_hold(counts, mixture, len(rows))
