"""The fine-tuning loop (`train`, `TrainJob` in `loop`) and its parts: what is trained (`frameworks`),
what each framework's batch and loss terms are (`methods`; the HN-CLIP objective itself is
`hnclip.losses.objective`),
checkpoints, exact large-batch and compute-batch steps, the gradient probe and multi-process runs."""

from hnclip._lazy import lazy_exports

_EXPORTS = {
    "train": "hnclip.training.loop",
    "TrainJob": "hnclip.training.loop",
    "NonFiniteLossError": "hnclip.training.step",
    "loss_terms": "hnclip.losses.objective",
    "group_terms": "hnclip.losses.objective",
    "TrainedModel": "hnclip.training.frameworks",
    "build_method": "hnclip.training.methods",
    "compute_batch_backward": "hnclip.training.compute_batch",
    "finetune_job": "hnclip.training.jobs",
    "pretrain_job": "hnclip.training.jobs",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
