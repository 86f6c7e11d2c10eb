"""StructXLIP's released caption-filter word lists, as data.

Copied verbatim (order kept) from `DEFAULT_VOCAB` (lines 61-102) and `STOPWORDS` (lines 6-27, sorted here) of
structxlip/text_filters.py in intelligolabs/StructXLIP at commit bd63274c20b173b5e4457390730665658b15e8f3
(git blob 2e91b9ab172d0230edacaf6363a0b081023c064f). The release generated them with an LLM; the lists
themselves ship with the code. `hnclip.auxiliary.caption_filter` applies them as the release does.

Content pins: `RELEASE_SHA256` holds, per list, the sha256 of the list as the release's file has it
(`list_sha256`: canonical JSON of the list in the release's order, STOPWORDS sorted since the release keeps
them in a set). `check_release()` recomputes them from the tuples below, so a misspelt, dropped, added
or moved word fails loudly (lengths and a few samples would not see it); `caption_filter` runs it on
import. The pins were computed from the release's file itself,
https://github.com/intelligolabs/StructXLIP/blob/bd63274c20b173b5e4457390730665658b15e8f3/structxlip/text_filters.py
(sha256 5345793de693d0ba410b77733aaf5ebf20321d899b117861a0f29cdbc4e63445), with
  git show bd63274c20b173b5e4457390730665658b15e8f3:structxlip/text_filters.py > text_filters.py
  python -c "from hnclip.auxiliary.structxlip_lexicon import *; \
             print({k: list_sha256(v) for k, v in lists_from_release(open('text_filters.py').read()).items()})"
"""
from __future__ import annotations

import ast

from hnclip.hashing import json_sha256

SOURCE = {"repository": "intelligolabs/StructXLIP", "commit": "bd63274c20b173b5e4457390730665658b15e8f3",
          "path": "structxlip/text_filters.py", "blob": "2e91b9ab172d0230edacaf6363a0b081023c064f",
          "objects": "DEFAULT_VOCAB (lines 61-102), STOPWORDS (lines 6-27)"}

COLORS = (  # DEFAULT_VOCAB.colors, 56 phrases
    "red", "blue", "green", "yellow", "black", "white", "gray", "grey", "orange", "purple", "pink", "brown",
    "beige", "cyan", "magenta", "turquoise", "teal", "maroon", "navy", "violet", "indigo", "gold", "silver",
    "ivory", "cream", "olive", "tan", "peach", "mint", "burgundy", "crimson", "scarlet", "lavender", "lilac",
    "azure", "aqua", "aquamarine", "navy blue", "sky blue", "baby blue", "light blue", "dark blue", "light green",
    "dark green", "forest green", "lime green", "light red", "dark red", "rose red", "wine red", "light pink",
    "hot pink", "dark gray", "light gray", "dark grey", "light grey",
)
MATERIALS = (  # DEFAULT_VOCAB.materials, 46
    "cotton", "wool", "silk", "linen", "denim", "leather", "suede", "velvet", "satin", "chiffon", "polyester",
    "nylon", "spandex", "acrylic", "rayon", "cashmere", "fleece", "corduroy", "lace", "mesh", "canvas", "tweed",
    "felt", "rubber", "plastic", "metal", "steel", "iron", "aluminum", "bronze", "brass", "ceramic", "glass",
    "wood", "bamboo", "stone", "marble", "granite", "concrete", "clay", "paper", "fur", "shearling", "down",
    "feather", "foam",
)
TEXTURES = (  # DEFAULT_VOCAB.textures, 47
    "smooth", "rough", "soft", "hard", "glossy", "matte", "shiny", "dull", "coarse", "fine", "grainy", "fuzzy",
    "fluffy", "silky", "velvety", "wrinkled", "crumpled", "woven", "knit", "striped", "plaid", "checkered",
    "polka dot", "dotted", "spotted", "paisley", "floral", "camouflage", "camo", "animal print", "zebra print",
    "leopard print", "snake print", "herringbone", "chevron", "geometric", "abstract", "tie dye", "ombre",
    "gradient", "marbled", "transparent", "translucent", "opaque", "frosted", "sheer", "netted",
)
INSECT_TERMS = (  # DEFAULT_VOCAB.insect_terms, 114
    "black", "brown", "dark brown", "light brown", "tan", "beige", "cream", "white", "off white", "gray", "grey",
    "charcoal", "slate", "ash", "red", "reddish", "orange", "yellow", "green", "blue", "purple", "pink", "magenta",
    "violet", "rust", "russet", "chestnut", "mahogany", "ochre", "umber", "sienna", "tawny", "fawn", "amber",
    "golden", "bronze", "coppery", "pale", "dusky", "faded", "drab", "rufous", "testaceous", "fulvous",
    "ferruginous", "castaneous", "fuscous", "livid", "piceous", "violaceous", "cyaneous", "glaucous", "mottled",
    "blotchy", "flecked", "stained", "tinged", "tinted", "smudged", "clouded", "diffuse", "suffused", "melanized",
    "depigmented", "discolored", "frosted", "pruinose", "powdery", "mealy", "chalky", "dusty", "granular",
    "velvety", "shaded", "darkened", "lightened", "somber", "sooty", "smoky", "iridescent", "metallic",
    "submetallic", "opalescent", "pearlescent", "prismatic", "lustrous", "holographic", "glossy", "subglossy",
    "matte", "satiny", "silky", "polished", "reflective", "non reflective", "transparent", "translucent",
    "semi translucent", "opaque", "hyaline", "subhyaline", "smoky hyaline", "warm toned", "cool toned", "earthy",
    "vivid", "bright", "dark colored", "silken", "glassy", "resinous", "waxy", "glistening", "gleaming",
)
STOPWORDS = (  # STOPWORDS (lines 6-27), 20 words
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "is", "it", "of", "on", "or", "that",
    "the", "to", "with",
)

# `list_sha256` of each list of the release's file (see the module docstring)
RELEASE_SHA256 = {
    "colors": "3a089cfd3c5cb0f92f17065cad92262fc0d2e98488804edd5b730b673e2db533",
    "materials": "6cb1d7939446c901dcf34c49465b76f9ba808f47346140f116791dd393f5d759",
    "textures": "9f70c63c4d8591ed0c149cfb950917d3b38108c1230c37128a2cb8defafff365",
    "insect_terms": "190645f9d300326e8d83e898b9e891b544f815e25dacf9ad154bf78e447b1349",
    "stopwords": "2a5e36b188dd6b70baed411787c7411150e0f922b1b646821adacf62bdfbfb39",
}


def lists() -> dict[str, tuple[str, ...]]:
    """The lists held here, under the release's names (DEFAULT_VOCAB's fields, and STOPWORDS)."""
    return {"colors": COLORS, "materials": MATERIALS, "textures": TEXTURES, "insect_terms": INSECT_TERMS,
            "stopwords": STOPWORDS}


def list_sha256(words) -> str:
    """A list's pin: sha256 of the canonical JSON of its words, in order (`hnclip.hashing.json_sha256`)."""
    return json_sha256(list(words))


def lists_from_release(source_text: str) -> dict[str, list[str]]:
    """The lists of the release's structxlip/text_filters.py, read from its source text (how the pins
    were made): DEFAULT_VOCAB's fields in order, STOPWORDS (a set there) sorted."""
    found: dict[str, list[str]] = {}
    for node in ast.parse(source_text).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
            continue
        if node.targets[0].id == "STOPWORDS":
            found["stopwords"] = sorted(ast.literal_eval(node.value))
        elif node.targets[0].id == "DEFAULT_VOCAB":
            found.update({kw.arg: list(ast.literal_eval(kw.value)) for kw in node.value.keywords})
    return found


def check_release(current: dict | None = None) -> None:
    """Raise ValueError naming every list whose content differs from the release's (default: ours)."""
    current = lists() if current is None else current
    differing = [name for name, pin in RELEASE_SHA256.items()
                 if name not in current or list_sha256(current[name]) != pin]
    if differing:
        raise ValueError(
            f"StructXLIP word list(s) {differing} differ from the release's "
            f"({SOURCE['repository']}@{SOURCE['commit'][:7]}:{SOURCE['path']}): a word was changed, added, "
            f"dropped or moved in {__name__}. Restore the release's lists; see the module docstring.")
