"""Auxiliary inputs of the baseline frameworks (segments, LISM pairs, edge maps, filtered captions)."""
