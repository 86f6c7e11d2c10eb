"""Pieces of the fine-tuning loop (`hnclip.train`): training frameworks (full / LoRA / DoRA),
exact large-batch steps, the gradient probe and multi-process data parallelism."""
