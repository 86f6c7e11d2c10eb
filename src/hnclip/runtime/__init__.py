"""Where a job runs: device resolution (CUDA, Ascend NPU, MPS, CPU; bf16 autocast) and GPU slots."""

from hnclip._lazy import lazy_exports

_EXPORTS = {
    "resolve_device": "hnclip.runtime.device",
    "autocast_context": "hnclip.runtime.device",
    "acquire_slot": "hnclip.runtime.gpu_slots",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
