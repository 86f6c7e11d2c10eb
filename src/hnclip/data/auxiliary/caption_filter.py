"""StructXLIP's text side: the lexicon caption filter and the structure chunks of a filtered caption.

Filter (SX structxlip/text_filters.py, spec: shared/research/baselines.md §2.1): per lexicon category
one case-insensitive `\\b(...)\\b` regex with the longest phrase first and spaces matching any
whitespace run; every match becomes a space, whitespace and punctuation are tidied, and if fewer
than `MIN_CONTENT_WORDS` non-stopword words remain the (tidied) original is kept. The released
setting removes colours only.

The lexicons below are our own lists of the same kind and size (colours ~56 incl. shades such as
"navy blue", materials ~46, textures ~47); the released lexicon text (an unreleased LLM's output)
is not reproduced verbatim. They cover every colour and texture word of our synthetic captions.

Chunks (SX structxlip/losses.py:33-92): word windows inside the clauses of the filtered caption,
mapped to token positions of open_clip's `SimpleTokenizer` (see `chunk_token_spans`).
"""
from __future__ import annotations

import bisect
import re

COLORS = (
    "red", "orange", "yellow", "green", "blue", "purple", "white", "black", "gray", "grey", "brown",
    "pink", "violet", "indigo", "cyan", "magenta", "teal", "turquoise", "beige", "tan", "gold", "golden",
    "silver", "bronze", "copper", "maroon", "burgundy", "crimson", "scarlet", "navy", "olive", "khaki",
    "lavender", "lilac", "ivory", "cream", "charcoal", "coral", "salmon", "peach", "amber", "mustard",
    "aqua", "navy blue", "sky blue", "light blue", "dark blue", "royal blue", "light green", "dark green",
    "lime green", "forest green", "light gray", "light grey", "dark gray", "dark grey",
)
MATERIALS = (
    "cotton", "wool", "silk", "linen", "denim", "leather", "suede", "velvet", "nylon", "polyester",
    "fleece", "lace", "canvas", "burlap", "fur", "rubber", "plastic", "metal", "metallic", "steel",
    "stainless steel", "iron", "cast iron", "aluminum", "aluminium", "brass", "chrome", "foam", "ceramic",
    "porcelain", "glass", "wood", "wooden", "plywood", "bamboo", "wicker", "rattan", "stone", "marble",
    "granite", "concrete", "brick", "clay", "terracotta", "cardboard", "paper",
)
TEXTURES = (
    "solid", "striped", "stripes", "pinstriped", "dotted", "dots", "polka dot", "polka dotted", "spotted",
    "speckled", "checkered", "checkerboard", "plaid", "tartan", "gingham", "houndstooth", "herringbone",
    "chevron", "zigzag", "floral", "paisley", "camouflage", "glossy", "matte", "shiny", "dull", "smooth",
    "rough", "bumpy", "grainy", "coarse", "fuzzy", "fluffy", "furry", "silky", "velvety", "woven",
    "knitted", "quilted", "ribbed", "corrugated", "wrinkled", "crumpled", "marbled", "mottled",
    "transparent", "translucent",
)
LEXICONS = {"colors": COLORS, "materials": MATERIALS, "textures": TEXTURES}  # applied in this order

STOPWORDS = frozenset((
    "a", "an", "the", "and", "or", "of", "in", "on", "at", "to", "for", "from", "with", "by", "as",
    "is", "are", "be", "it", "that",
))
MIN_CONTENT_WORDS = 2

MAX_CHUNKS = 64
CONTEXT_LENGTH = 248

_WORD = re.compile(r"\b\w+\b")
_CLAUSE_END = re.compile(r"[.,;!?]+")


def _lexicon_pattern(phrases: tuple[str, ...]) -> re.Pattern:
    # Longest first so "navy blue" wins over "blue" in the alternation.
    ordered = sorted({p.lower() for p in phrases}, key=lambda p: (-len(p), p))
    alternatives = (r"\s+".join(re.escape(word) for word in phrase.split()) for phrase in ordered)
    return re.compile(r"\b(" + "|".join(alternatives) + r")\b", re.IGNORECASE)


_PATTERNS = {name: _lexicon_pattern(words) for name, words in LEXICONS.items()}


def _tidy(text: str) -> str:
    """Collapse whitespace and repair the punctuation that removed words leave behind."""
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r" ([,.;:!?])", r"\1", text)      # "ball ." -> "ball."
    text = re.sub(r"([,.;:!?])\1+", r"\1", text)    # ",," / ".." from an emptied list item
    text = re.sub(r",(?: ?,)+", ",", text)           # ", ," -> ","
    return text.strip()


def filter_caption(text: str, categories: tuple[str, ...] = ("colors",)) -> str:
    """The caption with every lexicon phrase of `categories` removed, or the tidied original when
    fewer than two non-stopword words would remain."""
    unknown = set(categories) - set(LEXICONS)
    if unknown:
        raise ValueError(f"unknown lexicon categories {sorted(unknown)}; allowed: {', '.join(LEXICONS)}")
    original = _tidy(text)
    filtered = original
    for name, pattern in _PATTERNS.items():
        if name in categories:
            filtered = pattern.sub(" ", filtered)
    filtered = _tidy(filtered)
    content = [w for w in _WORD.findall(filtered.lower()) if w not in STOPWORDS]
    return filtered if len(content) >= MIN_CONTENT_WORDS else original


def _window(n_words: int) -> int:
    """Chunk length (words) for a clause of `n_words` words."""
    for limit, window in ((4, 2), (10, 3), (20, 4), (40, 5)):
        if n_words <= limit:
            return window
    return 6


def caption_chunks(text: str) -> list[tuple[int, int]]:
    """Character spans [start, end) of the structure chunks of `text` (the filtered caption).

    Words are `\\b\\w+\\b`; a clause ends after each run of `[.,;!?]`; inside a clause of n words a
    window of `_window(n)` words slides with stride 1 (a clause shorter than its window gives no
    chunk). At most the first `MAX_CHUNKS` chunks, in text order.
    """
    words = list(_WORD.finditer(text))
    clause_ends = [m.end() for m in _CLAUSE_END.finditer(text)]
    clauses: dict[int, list[re.Match]] = {}
    for word in words:
        # A word belongs to the clause whose punctuation run ends after the word starts.
        clauses.setdefault(bisect.bisect_right(clause_ends, word.start()), []).append(word)
    chunks = []
    for clause in clauses.values():
        window = _window(len(clause))
        for i in range(len(clause) - window + 1):
            chunks.append((clause[i].start(), clause[i + window - 1].end()))
    return chunks[:MAX_CHUNKS]


def _char_token_positions(text: str, tokenizer) -> list[int] | None:
    """Token position (BOS = 0) of every character of `text`, -1 on whitespace; None when the
    word-by-word tokenization differs from the whole-text one (the map would then be wrong).

    SimpleTokenizer has no offset mapping, so `text` is tokenized one whitespace-separated word at a
    time (BPE never crosses whitespace, so the words' tokens concatenate to the caption's tokens);
    inside a word, each character goes to the token holding its first UTF-8 byte, the tokens'
    byte lengths being those of their BPE strings.
    """
    positions = [-1] * len(text)
    ids: list[int] = []
    for word in re.finditer(r"\S+", text):
        word_ids = tokenizer.encode(word.group())
        token_ends = []
        total = 0
        for token_id in word_ids:
            total += len(tokenizer.decoder[token_id].removesuffix("</w>"))
            token_ends.append(total)
        offset = 0
        for k, char in enumerate(word.group().lower()):
            if word_ids:
                token = min(bisect.bisect_right(token_ends, offset), len(word_ids) - 1)
                positions[word.start() + k] = 1 + len(ids) + token
            offset += len(char.encode("utf-8"))
        ids += word_ids
    return positions if ids == tokenizer.encode(text) else None


def chunk_token_spans(chunks: list[tuple[int, int]], text: str, tokenizer,
                      context_length: int = CONTEXT_LENGTH) -> list[tuple[int, int]]:
    """Token spans [start, end) (BOS at position 0) of the character `chunks` of `text`.

    A chunk runs from the token of its first character to the token of its last one; chunks that
    end past `context_length` are dropped. A caption whose tokenization cannot be mapped to
    characters (see `_char_token_positions`) gets no spans.
    """
    positions = _char_token_positions(text, tokenizer)
    if positions is None:
        return []
    spans = []
    for start, end in chunks:
        first, last = positions[start], positions[end - 1]
        if first >= 1 and last >= first and last + 1 <= context_length:
            spans.append((first, last + 1))
    return spans


def structure_chunk_spans(filtered_caption: str, tokenizer,
                          context_length: int = CONTEXT_LENGTH) -> list[tuple[int, int]]:
    """The L_LSC token spans of one sample: chunks located in, and tokenized from, the FILTERED caption.

    The same spans are used whichever token sequence the `chunk_tokens` setting names: with
    "filtered" they index the filtered caption's tokens (aligned); with "unfiltered" (released
    behaviour) they index the original caption's tokens, misaligned after its first removed word.
    """
    return chunk_token_spans(caption_chunks(filtered_caption), filtered_caption, tokenizer, context_length)
