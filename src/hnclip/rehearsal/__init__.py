"""The paper profile's rehearsal: `paper_rehearsal` (params.yaml) is the paper profile in everything but
size, fed by a loopback mirror of real-format miniatures of every source file.

mirror            the miniatures (`build_mirror`) and the files they are pinned by
miniature_models  tiny models of the real classes in the real layouts (Long-CLIP checkpoint, SAM, CLIP)
archive_writers   byte-stable tar / tar.gz / zip writers
server            the loopback HTTP server of a folder
command           the one command: mirror, serve, `snakemake --config profile=paper_rehearsal`, stop

Run it with `python -m hnclip.rehearsal` (scripts/paper_rehearsal.sh) from the project root.
"""
