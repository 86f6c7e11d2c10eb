"""Where the paper's real data and weights come from: the source table, as data.

Every file names its URL (pinned to a revision where the host has one), its checksum and which
algorithm that checksum uses, its size where known, whether it needs a manual step, and its licence.
Facts and their provenance: shared/research/anchors-paper.md, section 2.

A checksum of None means nobody has verified the file yet: the downloader then records the sha256 it
saw in the file's `.complete` marker, and that value should be pinned here ("pin on first verified
download"). Pins marked "third-party" come from other people's download scripts, not from the
dataset's authors: a mismatch there may mean the pin, not the download, is wrong.

Files on the Hugging Face Hub name their repo (`hub_repo`) and are fetched with `hf_hub_download` at
`revision`, which for them must be a full 40-character commit (a branch such as `main` can move);
HF_ENDPOINT points the library at another Hub endpoint.

Mirrors: set HNCLIP_MIRROR (or pass `mirror=`) to a base URL that serves `<source>/<file name>`;
every automatic file, Hub files included, is then fetched from there instead (tests use a local HTTP
server this way).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Mapping

from hnclip.errors import UnknownNameError

MIRROR_ENV = "HNCLIP_MIRROR"
UNPINNED = "pin on first verified download"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")

GOAL_REPO = "https://raw.githubusercontent.com/PerceptualAI-Lab/GOAL"
# Commits at which these files were seen in the GOAL repository (anchors-paper.md cites the repo at
# 2db3d4a and the train list at c3f9cc0; these are the full commits of the stored copies we read).
GOAL_TRAIN_LIST_COMMIT = "34f018e820e204ee06f9c7f56b173526ab07cb8a"
GOAL_DCI_TEST_COMMIT = "eee0686420aae054d6d79e2289369e99c114ddf4"
URBAN1K_REVISION = "953fcf1d1a3bde031d9424a91a0154e594b5a586"


@dataclass(frozen=True)
class SourceFile:
    """One file of a source, as it lands in `<root>/<source>/raw/<name>`."""
    name: str
    url: str | None                      # None: no stable URL (manual files)
    checksum: str | None = None          # None: unknown, see UNPINNED
    algorithm: str = "sha256"            # which hash `checksum` is
    size: int | None = None              # bytes, where known
    revision: str | None = None          # the commit / revision the URL is pinned to (Hub files: required commit)
    hub_repo: str | None = None          # Hugging Face Hub repo id: fetched with hf_hub_download at `revision`
    hub_repo_type: str = "model"         # "model" or "dataset"
    manual: bool = False                 # never fetched automatically
    instructions: str = ""               # for manual files: what to fetch, from where
    satisfied_by: str | None = None      # manual files: path under extracted/ that, if present, means done by hand
    extract_to: str = ""                 # archives: folder under extracted/ to unpack into
    extract_only: str | None = None      # archives: glob on member base names to unpack (None = all)
    flatten: bool = False                # archives: drop member folders (the layout inside is unverified)
    license: str = ""
    note: str = ""

    @property
    def is_archive(self) -> bool:
        return self.name.endswith(ARCHIVE_SUFFIXES)


@dataclass(frozen=True)
class Source:
    name: str
    title: str
    homepage: str
    license: str
    files: tuple[SourceFile, ...]
    note: str = ""

    def file(self, name: str) -> SourceFile:
        for source_file in self.files:
            if source_file.name == name:
                return source_file
        raise KeyError(f"source {self.name!r} has no file {name!r}; it has {[f.name for f in self.files]}")

    def with_files(self, changes: Mapping[str, Mapping[str, Any]]) -> "Source":
        """A copy with some files' fields replaced, e.g. with_files({"a.zip": {"checksum": h}})."""
        files = tuple(replace(f, **changes[f.name]) if f.name in changes else f for f in self.files)
        unknown = set(changes) - {f.name for f in self.files}
        if unknown:
            raise KeyError(f"source {self.name!r} has no file(s) {sorted(unknown)}")
        return replace(self, files=files)


DOCCI = Source(
    name="docci",
    title="DOCCI: Descriptions of Connected and Contrasting Images (Onoe et al. 2024)",
    homepage="https://google.github.io/docci/",
    license="CC BY 4.0",
    note="Splits in the jsonl: train 9,647, test 5,000, qual_dev 100, qual_test 100. The paper's "
         "Table A1 says 9,450 train and 5,100 test (= test + qual_test, GOAL's docci_test.json).",
    files=(
        SourceFile(
            name="docci_descriptions.jsonlines",
            url="https://storage.googleapis.com/docci/data/docci_descriptions.jsonlines",
            checksum="c9df4819963883af35ddd2cf257949892fd8c6d88b33a012094352df60719800",
            size=11_000_214,
            revision="gcs generation 1714384012999810",
            license="CC BY 4.0",
            note="third-party pin (sha256 and size from others' download scripts), verify",
        ),
        SourceFile(
            name="docci_images.tar.gz",
            url="https://storage.googleapis.com/docci/data/docci_images.tar.gz",
            checksum="57493de5075fe508d51e77500748f4da",
            algorithm="md5",
            size=7_592_938_768,
            revision="gcs generation 1714249456173037",
            license="CC BY 4.0",
            note="third-party pin (md5), verify; unpacks to images/<image_file>",
        ),
        SourceFile(
            name="docci_test.json",
            url=f"{GOAL_REPO}/{GOAL_TRAIN_LIST_COMMIT}/datasets/docci_test.json",
            revision=GOAL_TRAIN_LIST_COMMIT,
            license="GOAL repository (PerceptualAI-Lab/GOAL); no licence file seen",
            note=f"GOAL's DOCCI test list: 5,100 {{filename, caption}} = test + qual_test; {UNPINNED}",
        ),
    ),
)

SA1B_INSTRUCTIONS = (
    "DCI's photos are the SA-1B shard sa_000138.tar (about 11 GB, 11,186 photos of which DCI uses "
    "7,805; SA-1B ids 1543972-1554261). SA-1B sits behind a licence click-through: accept the "
    "SA-1B Dataset Research License at https://ai.meta.com/datasets/segment-anything-downloads/, "
    "download the links file it offers, and fetch the line for sa_000138.tar with the signed URL "
    "given there (the URLs expire). No checksum is published for it."
)

DCI = Source(
    name="dci",
    title="DCI: Densely Captioned Images (Urbanek et al. 2024)",
    homepage="https://github.com/facebookresearch/DCI",
    license="annotations CC BY-NC 4.0; photos: SA-1B Dataset Research License",
    note="7,805 annotated images, splits.json {train, valid, test}. The paper follows GOAL's split: "
         "train list 5,446 unique images (paper: 5,445), test 1,999; Long-DCI = 7,444 images "
         "(GOAL train + test gives 7,445; all of splits.json gives 7,805).",
    files=(
        SourceFile(
            name="dci.tar.gz",
            url="https://dl.fbaipublicfiles.com/densely_captioned_images/dci.tar.gz",
            checksum="d865c244150168d3f25daaad0bf5b70b2123cf3e83ca7b0e207d5b26943c5fc7",
            revision="facebookresearch/DCI@8326c97 scripts/download.py",
            license="CC BY-NC 4.0",
            note="unpacks to densely_captioned_images/{annotations/, splits.json}; an earlier DCI "
                 "commit (3d95af6) pinned 9caff10cb6324c801d9020638f49925f04de87d897ca8614c599f3c43bef3aeb, "
                 "i.e. the archive was re-released once",
        ),
        SourceFile(
            name="sa_000138.tar",
            url=None,
            manual=True,
            instructions=SA1B_INSTRUCTIONS,
            satisfied_by="densely_captioned_images/photos",
            extract_to="densely_captioned_images/photos",
            extract_only="*.jpg",
            flatten=True,
            license="SA-1B Dataset Research License (no redistribution)",
            note=f"{UNPINNED}; only the .jpg files are unpacked, flat, into photos/",
        ),
        SourceFile(
            name="DCI_test.json",
            url=f"{GOAL_REPO}/{GOAL_DCI_TEST_COMMIT}/datasets/DCI_test.json",
            revision=GOAL_DCI_TEST_COMMIT,
            license="GOAL repository (PerceptualAI-Lab/GOAL); no licence file seen",
            note=f"GOAL's DCI test list: 1,999 {{filename, caption}}; {UNPINNED}",
        ),
        SourceFile(
            name="DCI_segment_only_sim_max_del_org.json",
            url=f"{GOAL_REPO}/{GOAL_TRAIN_LIST_COMMIT}/datasets/DCI_segment_only_sim_max_del_org.json",
            revision=GOAL_TRAIN_LIST_COMMIT,
            license="GOAL repository (PerceptualAI-Lab/GOAL); no licence file seen",
            note="GOAL's DCI train list (one segment entry per image, 5,446 unique images; later "
                 f"renamed DCI_segment_sim_bbox_del_org.json upstream); {UNPINNED}",
        ),
    ),
)

URBAN1K = Source(
    name="urban1k",
    title="Urban-1K (Zhang et al. 2024, Long-CLIP)",
    homepage="https://huggingface.co/datasets/BeichenZhang/Urban1k",
    license="CC BY-NC 4.0",
    note="Test only: 1,000 image/caption pairs. The archive was renamed between revisions "
         "(Urban-1k.zip at c225a0b, Urban1k.zip at 953fcf1): keep the revision pinned.",
    files=(
        SourceFile(
            name="Urban1k.zip",
            url=f"https://huggingface.co/datasets/BeichenZhang/Urban1k/resolve/{URBAN1K_REVISION}/Urban1k.zip",
            checksum="08e42b3fada77abf7f890a087ed6e9f9fbba1dc143f9f09801ed83187ae617b8",
            size=80_586_923,
            revision=URBAN1K_REVISION,
            hub_repo="BeichenZhang/Urban1k",
            hub_repo_type="dataset",
            license="CC BY-NC 4.0",
            note="third-party pin (reported equal to the HF LFS oid), verify; unpacks to "
                 "Urban1k/image/<n>.jpg and Urban1k/caption/<n>.txt",
        ),
    ),
)

VG_IM2P = "https://cs.stanford.edu/people/ranjaykrishna/im2p"
VG_PARAGRAPHS = Source(
    name="vg_paragraphs",
    title="Visual Genome paragraphs (Krause et al. 2017), the paper's training set for Urban-1K",
    homepage=f"{VG_IM2P}/index.html",
    license="Visual Genome: CC BY 4.0",
    note="Commonly cited splits 14,575 / 2,487 / 2,489 (unverified); the paper's Table A1 says "
         "14,579 train: count locally. Images come from both VG image archives.",
    files=(
        SourceFile(name="paragraphs_v1.json", url=f"{VG_IM2P}/paragraphs_v1.json",
                   license="CC BY 4.0", note=f"list of {{image_id, paragraph, url}}; {UNPINNED}"),
        SourceFile(name="train_split.json", url=f"{VG_IM2P}/train_split.json",
                   license="CC BY 4.0", note=f"array of image ids; {UNPINNED}"),
        SourceFile(name="val_split.json", url=f"{VG_IM2P}/val_split.json",
                   license="CC BY 4.0", note=f"array of image ids; {UNPINNED}"),
        SourceFile(name="test_split.json", url=f"{VG_IM2P}/test_split.json",
                   license="CC BY 4.0", note=f"array of image ids; {UNPINNED}"),
        SourceFile(name="images.zip", url="https://cs.stanford.edu/people/rak248/VG_100K_2/images.zip",
                   size=9_731_705_982, license="CC BY 4.0",
                   note=f"unpacks to VG_100K/<image_id>.jpg; size third-party; {UNPINNED}"),
        SourceFile(name="images2.zip", url="https://cs.stanford.edu/people/rak248/VG_100K_2/images2.zip",
                   size=5_471_658_058, license="CC BY 4.0",
                   note=f"unpacks to VG_100K_2/<image_id>.jpg; size third-party; {UNPINNED}"),
    ),
)

LONGCLIP_L = Source(
    name="longclip_l",
    title="Long-CLIP-L weights (Zhang et al. 2024)",
    homepage="https://huggingface.co/BeichenZhang/LongCLIP-L",
    license="see the model card (Long-CLIP code: Apache-2.0); verify before redistribution",
    note="Several uploads in the HF history (a298569, 92e2948; re-released 2024-05-21 after a DDP "
         "fix): the sha256 pins the content, whatever revision `main` points to.",
    files=(
        SourceFile(
            name="longclip-L.pt",
            url="https://huggingface.co/BeichenZhang/LongCLIP-L/resolve/main/longclip-L.pt",
            checksum="60c077e512cd95ca9fe7b13285e4e2c99073f8d6df7113eb6d2979919db397b2",
            hub_repo="BeichenZhang/LongCLIP-L",
            # PLACEHOLDER: the full commit is not known yet (only the short a298569 / 92e2948). Until it is
            # pinned, the Hub download refuses and says how to pin it; a mirror or a copy placed by hand
            # still works, checked against the sha256 above.
            revision=None,
            license="see model card",
            note="about 1.71 GB, pickled fp32 state_dict",
        ),
    ),
)


def _hub_files(repo: str, names: tuple[str, ...], note: str) -> tuple[SourceFile, ...]:
    """Files of a Hub model repo, loaded by transformers' from_pretrained from the raw/ folder."""
    return tuple(SourceFile(name=name, url=f"https://huggingface.co/{repo}/resolve/main/{name}", hub_repo=repo,
                            revision=None, note=note) for name in names)


# The baselines' auxiliary-input models (paper profile). PLACEHOLDER pins as for Long-CLIP: the
# full commits and checksums are not known here (no network); the Hub download refuses until the
# revision is pinned and says how. The file lists are those of the repos as we know them.
SAM_VIT_HUGE = Source(
    name="sam_vit_huge",
    title="Segment Anything ViT-H (GOAL's LISM masks: transformers' default mask-generation model)",
    homepage="https://huggingface.co/facebook/sam-vit-huge",
    license="Apache-2.0",
    files=_hub_files("facebook/sam-vit-huge", ("config.json", "preprocessor_config.json", "model.safetensors"),
                     f"{UNPINNED}; about 2.6 GB in total"),
)
CLIP_VIT_L14_336 = Source(
    name="clip_vit_l14_336",
    title="OpenAI CLIP ViT-L/14-336 (GOAL's sentence-to-segment matcher)",
    homepage="https://huggingface.co/openai/clip-vit-large-patch14-336",
    license="MIT",
    files=_hub_files("openai/clip-vit-large-patch14-336",
                     ("config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
                      "vocab.json", "merges.txt", "special_tokens_map.json", "model.safetensors"),
                     f"{UNPINNED}; about 1.7 GB in total"),
)

SOURCES: dict[str, Source] = {s.name: s for s in (DOCCI, DCI, URBAN1K, VG_PARAGRAPHS, LONGCLIP_L, SAM_VIT_HUGE,
                                                  CLIP_VIT_L14_336)}


class UnknownSourceError(UnknownNameError, KeyError):
    """A source name the source table does not have."""

    def __str__(self) -> str:  # KeyError quotes its message; a user error reads as a sentence
        return str(self.args[0])


def get_source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise UnknownSourceError(f"unknown source {name!r}; known: {sorted(SOURCES)}") from None


def mirror_base(mirror: str | None = None) -> str | None:
    """The mirror to use: the argument, else $HNCLIP_MIRROR, else None (the original hosts)."""
    base = mirror if mirror is not None else os.environ.get(MIRROR_ENV) or None
    return base.rstrip("/") if base else None


def resolve_url(source: str, source_file: SourceFile, mirror: str | None = None) -> str | None:
    """Where to fetch a file from: `<mirror>/<source>/<name>` if a mirror is set, else its own URL."""
    base = mirror_base(mirror)
    if base is not None:
        return f"{base}/{source}/{source_file.name}"
    return source_file.url
