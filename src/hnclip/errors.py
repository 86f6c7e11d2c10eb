"""Errors a user can fix. Their message names the cause and what to do; `hnclip` prints it as one
line and exits 2. Anything else is a bug and keeps its traceback."""
from __future__ import annotations


class UserError(Exception):
    """Base of every error whose message is the whole story (bad input, stale artifact, ...)."""


class StaleArtifactError(UserError, RuntimeError):
    """An artifact no longer matches the record that produced it (replaced file, changed settings)."""


class UnknownNameError(UserError, LookupError):
    """A table, run, benchmark, figure or setting that the registry does not know."""
