"""Auxiliary inputs of the baseline frameworks (segments, LISM pairs, edge maps, filtered captions). The
library side of one concept at two layers: the command that builds them (`hnclip auxiliary`) is
`hnclip.commands.auxiliary`."""
