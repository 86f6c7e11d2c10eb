"""hnclip: reproducibility pipeline for HN-CLIP (adaptive similarity margins for dense-caption retrieval)."""

__version__ = "0.1.0"
