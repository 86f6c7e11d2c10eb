"""The cost plan (`hnclip plan`): what a profile costs before it runs, and the SLURM limits the workflow
derives from it.

This package owns the rates (the paper's Table A3 or a measured throughput file), the settings, the model's
size, each job's images, hours, disk and accelerator memory, the critical path and the printed plan. The
Snakefile imports it to book each job's time limit, so nothing here imports torch.
"""
