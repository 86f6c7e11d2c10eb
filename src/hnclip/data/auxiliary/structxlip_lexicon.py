"""StructXLIP's released caption-filter word lists, as data.

Copied verbatim (order kept) from `DEFAULT_VOCAB` (lines 61-102) and `STOPWORDS` (lines 6-27, sorted here) of
structxlip/text_filters.py in intelligolabs/StructXLIP at commit bd63274c20b173b5e4457390730665658b15e8f3
(git blob 2e91b9ab172d0230edacaf6363a0b081023c064f). The release generated them with an LLM; the lists
themselves ship with the code. `hnclip.data.auxiliary.caption_filter` applies them as the release does.
"""
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
