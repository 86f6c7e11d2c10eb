"""Pieces of the fine-tuning loop (`hnclip.training.loop`): training frameworks (full / LoRA / DoRA),
exact large-batch steps, the gradient probe and multi-process data parallelism."""
