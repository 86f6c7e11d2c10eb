"""Where the paper's real data and weights come from: the source table, as data.

Every file names its URL (pinned to a revision where the host has one), its checksum and which
algorithm that checksum uses, its size where known, whether it needs a manual step, and its licence.
Facts and their provenance: shared/research/anchors-paper.md, section 2.

A checksum of None means nobody has verified the file yet: the downloader then records the sha256 it
saw in the file's `.complete` marker, and that value should be pinned here ("pin on first verified
download"). Pins marked "third-party" come from other people's download scripts, not from the
dataset's authors: a mismatch there may mean the pin, not the download, is wrong. Next to every pin
is the public page it was read from.

A file can also name releases it `supersedes` (an older upload the author replaced): a copy with one
of those checksums is refused like any other, with a message that says what it is and how to get
the current release.

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
GOAL_BLOB = "https://github.com/PerceptualAI-Lab/GOAL/blob"
# Commits at which these files were seen in the GOAL repository (anchors-paper.md cites the repo at
# 2db3d4a and the train list at c3f9cc0; these are the full commits of the stored copies we read).
# The split files' sha256 and sizes are those of the git blobs at these commits
# (`git show <commit>:datasets/<file> | sha256sum`), i.e. what raw.githubusercontent.com serves.
GOAL_TRAIN_LIST_COMMIT = "34f018e820e204ee06f9c7f56b173526ab07cb8a"
GOAL_DCI_TEST_COMMIT = "eee0686420aae054d6d79e2289369e99c114ddf4"
URBAN1K_REVISION = "953fcf1d1a3bde031d9424a91a0154e594b5a586"


@dataclass(frozen=True)
class Superseded:
    """An earlier upload of a file that its author replaced: recognised by checksum or size, never accepted."""
    sha256: str
    size: int | None
    what: str      # what that upload is, for the user holding it (names no commit to go back to)


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
    supersedes: tuple[Superseded, ...] = ()  # earlier uploads the author replaced (refused, with a message)

    @property
    def is_archive(self) -> bool:
        return self.name.endswith(ARCHIVE_SUFFIXES)

    def superseded_by_this(self, got: str | int | None) -> Superseded | None:
        """The superseded upload whose sha256 (or, when only sizes were compared, size) is `got`."""
        return next((old for old in self.supersedes if got is not None and got in (old.sha256, old.size)), None)


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
            # sha256 of the blob at f"{GOAL_BLOB}/{GOAL_TRAIN_LIST_COMMIT}/datasets/docci_test.json"
            # (unchanged at GOAL's head 2db3d4a)
            checksum="13280acd7a17da3956e77bf761f8f202a990964fcf73dfeb2eae459d85045ca3",
            size=3_883_735,
            revision=GOAL_TRAIN_LIST_COMMIT,
            license="GOAL repository (PerceptualAI-Lab/GOAL); no licence file seen",
            note="GOAL's DOCCI test list: 5,100 {filename, caption} = test + qual_test; sha256 of the git "
                 "blob at the pinned commit",
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
            # sha256 of the blob at f"{GOAL_BLOB}/{GOAL_DCI_TEST_COMMIT}/datasets/DCI_test.json"
            # (unchanged at GOAL's head 2db3d4a)
            checksum="35227d8dfe02eccfff44947ecd0c265fb20ce3c03a59c85f062356b7c15165ae",
            size=1_704_117,
            revision=GOAL_DCI_TEST_COMMIT,
            license="GOAL repository (PerceptualAI-Lab/GOAL); no licence file seen",
            note="GOAL's DCI test list: 1,999 {filename, caption}; sha256 of the git blob at the pinned commit",
        ),
        SourceFile(
            name="DCI_segment_only_sim_max_del_org.json",
            url=f"{GOAL_REPO}/{GOAL_TRAIN_LIST_COMMIT}/datasets/DCI_segment_only_sim_max_del_org.json",
            # sha256 of the blob at
            # f"{GOAL_BLOB}/{GOAL_TRAIN_LIST_COMMIT}/datasets/DCI_segment_only_sim_max_del_org.json"
            checksum="40affe13d27ed8dd3dfd255659338b7712ad0b5034ee9cef7632bfd076276b97",
            size=2_473_521,
            revision=GOAL_TRAIN_LIST_COMMIT,
            license="GOAL repository (PerceptualAI-Lab/GOAL); no licence file seen",
            note="GOAL's DCI train list (one segment entry per image, 5,446 unique images); sha256 of the git "
                 "blob at the pinned commit. Upstream removed it in 894a890, where "
                 "DCI_segment_sim_bbox_del_org.json appears instead: keep the commit pinned",
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
# The paragraphs themselves are served from Visual Genome's own dataset folder, not from the im2p
# page: public scripts fetch `paragraphs_v1.json.zip` there and unzip it, e.g.
# https://github.com/lukemelas/image-paragraph-captioning/blob/3e8996ad5a3e849c7df34e1ca3820f32f16d1b0b/data/captions/download.sh
# (the same script fetches the three split files from the im2p page, as below). Some newer scripts
# use the copy at https://homes.cs.washington.edu/~ranjay/visualgenome/data/dataset/paragraphs_v1.json.zip.
VG_DATASET = "https://visualgenome.org/static/data/dataset"
VG_PARAGRAPHS = Source(
    name="vg_paragraphs",
    title="Visual Genome paragraphs (Krause et al. 2017), the paper's training set for Urban-1K",
    homepage=f"{VG_IM2P}/index.html",
    license="Visual Genome: CC BY 4.0",
    note="19,561 images, splits 14,575 / 2,487 / 2,489 (as the im2p page states); the paper's Table A1 "
         "says 14,579 train: count locally. Images come from both VG image archives.",
    files=(
        SourceFile(name="paragraphs_v1.json.zip", url=f"{VG_DATASET}/paragraphs_v1.json.zip",
                   extract_only="paragraphs_v1.json", flatten=True,
                   license="CC BY 4.0",
                   note="unpacks to extracted/paragraphs_v1.json, a list of {image_id, paragraph, url}; no "
                        f"public checksum: {UNPINNED}"),
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

# Long-CLIP-L: the current release. The Hub repo's history (https://huggingface.co/BeichenZhang/LongCLIP-L/commits/main)
# is: 930338a initial commit; 92e2948 "Upload longclip-L.pt" (the first upload); 7aa337b "Delete
# longclip-L.pt"; a298569 "Upload longclip-L.pt" (the current file); f7ead1b "Upload README.md".
# Long-CLIP's README (https://github.com/beichenzbc/Long-CLIP, News) says: "[2024/5/21] We update the
# paper and checkpoints after fixing the bug in DDP". sha256 and size of each upload: the LFS pointer
# on its commit page, https://huggingface.co/BeichenZhang/LongCLIP-L/commit/<full commit>.
LONGCLIP_L_REVISION = "a29856989d49817508dbda0fb95c7f6ffc314331"
LONGCLIP_L_SHA256 = "9d2c12ffcbf9099f95bfb9cf8f08f949b695e22fb0018e8895e088f4a88b6afd"
LONGCLIP_L_SIZE = 1_711_923_133
LONGCLIP_L_URL = f"https://huggingface.co/BeichenZhang/LongCLIP-L/resolve/{LONGCLIP_L_REVISION}/longclip-L.pt"
LONGCLIP_L_FIRST_UPLOAD = Superseded(
    # https://huggingface.co/BeichenZhang/LongCLIP-L/commit/92e294835584c3209f2a722b86685e6f9184f588,
    # deleted by https://huggingface.co/BeichenZhang/LongCLIP-L/commit/7aa337bde41a51f79197fb044ec689d7698ce6ec
    sha256="60c077e512cd95ca9fe7b13285e4e2c99073f8d6df7113eb6d2979919db397b2",
    size=1_711_920_771,
    what="the first upload of Long-CLIP-L, from before the DDP fix: its author deleted it and uploaded "
         "updated weights (Long-CLIP's README: checkpoints updated 2024-05-21)",
)

LONGCLIP_L = Source(
    name="longclip_l",
    title="Long-CLIP-L weights (Zhang et al. 2024)",
    homepage="https://huggingface.co/BeichenZhang/LongCLIP-L",
    license="Apache-2.0 (model card); verify before redistribution",
    note="The current release (HF commit a298569, re-released after the DDP fix of 2024-05-21). The first "
         "upload (92e2948, deleted in 7aa337b) is a different file and is refused.",
    files=(
        SourceFile(
            name="longclip-L.pt",
            url=LONGCLIP_L_URL,
            checksum=LONGCLIP_L_SHA256,
            size=LONGCLIP_L_SIZE,
            hub_repo="BeichenZhang/LongCLIP-L",
            revision=LONGCLIP_L_REVISION,
            license="Apache-2.0 (model card)",
            note="pickled fp32 state_dict; sha256 and size from the LFS pointer on the commit page "
                 f"https://huggingface.co/BeichenZhang/LongCLIP-L/commit/{LONGCLIP_L_REVISION}",
            supersedes=(LONGCLIP_L_FIRST_UPLOAD,),
        ),
    ),
)


def _hub_file(repo: str, revision: str, name: str, note: str, **pin: object) -> SourceFile:
    """A file of a Hub model repo at a full commit, loaded by transformers' from_pretrained from raw/.
    The commit fixes every file's content; files without a published sha256 keep the one recorded on
    their first verified download."""
    return SourceFile(name=name, url=f"https://huggingface.co/{repo}/resolve/{revision}/{name}", hub_repo=repo,
                      revision=revision, note=note, **pin)  # type: ignore[arg-type]


# The baselines' auxiliary-input models (paper profile).
# SAM ViT-H: facebook/sam-vit-huge at 87aecf0, the revision public projects record for it (Hugging Face
# cache snapshots and pin tables, e.g. a SAM mirroring script with UPSTREAM_REVISIONS["huge"]). The
# weights' sha256 is the LFS pointer shown on https://huggingface.co/facebook/sam-vit-huge/blob/main/model.safetensors
# (added by "Adding `safetensors` variant of this model (#9)", 6758797), which the same public pin
# tables give for 87aecf0. Exact size: not published in what we could read (2.56 GB).
SAM_VIT_HUGE_REVISION = "87aecf0df4ce6b30cd7de76e87673c49644bdf67"
SAM_VIT_HUGE = Source(
    name="sam_vit_huge",
    title="Segment Anything ViT-H (GOAL's LISM masks: transformers' default mask-generation model)",
    homepage="https://huggingface.co/facebook/sam-vit-huge",
    license="Apache-2.0",
    note=f"facebook/sam-vit-huge at {SAM_VIT_HUGE_REVISION}; about 2.6 GB in total",
    files=(
        _hub_file("facebook/sam-vit-huge", SAM_VIT_HUGE_REVISION, "config.json",
                  f"content fixed by the commit; {UNPINNED}"),
        _hub_file("facebook/sam-vit-huge", SAM_VIT_HUGE_REVISION, "preprocessor_config.json",
                  f"content fixed by the commit; {UNPINNED}"),
        _hub_file("facebook/sam-vit-huge", SAM_VIT_HUGE_REVISION, "model.safetensors",
                  "2.56 GB; sha256 from the LFS pointer on the Hub's blob page",
                  checksum="edfb0462392541fca9af44ff039bfb32dbd0c939997f3abb77a26e23af7afd7c"),
    ),
)
# CLIP ViT-L/14-336: openai/clip-vit-large-patch14-336 at ce19dc9, the revision public projects record
# for it (Hugging Face cache snapshots, pin scripts). Its weights are pytorch_model.bin (and TensorFlow's
# tf_model.h5); no model.safetensors exists there. sha256 of pytorch_model.bin: the LFS pointer on
# https://huggingface.co/openai/clip-vit-large-patch14-336/blob/main/pytorch_model.bin ("add model",
# a2ab452); its size, 1,711,974,081 bytes, is third-party (a public pin script that lists this commit and
# this sha256). The file list is that of the repo's "add model" tree (a2ab452), less .gitattributes.
# transformers' CLIPModel.from_pretrained loads pytorch_model.bin when no model.safetensors is present.
CLIP_VIT_L14_336_REVISION = "ce19dc912ca5cd21c8a653c79e251e808ccabcd1"
CLIP_VIT_L14_336 = Source(
    name="clip_vit_l14_336",
    title="OpenAI CLIP ViT-L/14-336 (GOAL's sentence-to-segment matcher)",
    homepage="https://huggingface.co/openai/clip-vit-large-patch14-336",
    license="MIT",
    note=f"openai/clip-vit-large-patch14-336 at {CLIP_VIT_L14_336_REVISION}; about 1.7 GB in total",
    files=(
        *(_hub_file("openai/clip-vit-large-patch14-336", CLIP_VIT_L14_336_REVISION, name,
                    f"content fixed by the commit; {UNPINNED}")
          for name in ("config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
                       "vocab.json", "merges.txt", "special_tokens_map.json")),
        _hub_file("openai/clip-vit-large-patch14-336", CLIP_VIT_L14_336_REVISION, "pytorch_model.bin",
                  "1.71 GB, pickled fp32 weights; sha256 from the LFS pointer on the Hub's blob page, "
                  "size third-party",
                  checksum="c6032c2e0caae3dc2d4fba35535fa6307dbb49df59c7e182b1bc4b3329b81801",
                  size=1_711_974_081),
    ),
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
