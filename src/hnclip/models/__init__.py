"""Backbones: open_clip model construction (`create`, `load_backbone`, `load_weights`), the real
Long-CLIP-L checkpoint (`load_longclip`), towers that also return token features, and LoRA/DoRA adapters."""

from hnclip._lazy import lazy_exports

_EXPORTS = {
    "create": "hnclip.models.factory",
    "load_backbone": "hnclip.models.factory",
    "load_weights": "hnclip.models.factory",
    "save_weights": "hnclip.models.factory",
    "Backbone": "hnclip.models.factory",
    "load_longclip": "hnclip.models.longclip",
    "LongCLIP": "hnclip.models.longclip",
    "encode_batch": "hnclip.models.towers",
    "encode_image": "hnclip.models.towers",
    "encode_text": "hnclip.models.towers",
    "Encoded": "hnclip.models.towers",
    "apply_adapters": "hnclip.models.adapters",
    "merge_adapters": "hnclip.models.adapters",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
