"""One module per workflow verb (`hnclip <verb>`, one Snakemake rule each): it resolves the
registry's paths for the verb, calls the library, and writes the verb's outputs with provenance.
The CLI (`hnclip.cli`) only parses arguments and calls one function here."""
