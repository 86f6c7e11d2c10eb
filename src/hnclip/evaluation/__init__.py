"""Retrieval evaluation (Recall@K both directions, tie rule), epoch selection and caption geometry."""

from hnclip._lazy import lazy_exports

_EXPORTS = {
    "recall_at_k": "hnclip.evaluation.retrieval",
    "evaluate_model": "hnclip.evaluation.retrieval",
    "encode_dataset": "hnclip.evaluation.retrieval",
    "select_epochs": "hnclip.evaluation.selection",
    "mean_r1": "hnclip.evaluation.selection",
    "caption_geometry": "hnclip.evaluation.caption_geometry",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
