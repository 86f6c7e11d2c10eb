"""The claims scorecard: every quantitative claim of the paper (claims.yaml) judged on a profile's results
(results/claims.csv, results/claims.md), and how far each judgement can be trusted. The library side of
one concept at two layers: the command that writes the scorecard (`hnclip claims`) is `hnclip.commands.claims`.

This package owns the rules (claims.yaml), where their numbers come from (the tables' evaluation records,
the probe records, the paper's printed numbers), the statistic interpreter, the verdicts and the gate on
"supported", the tie tolerance, the simulated reproductions that measure each rule's size and null support
(calibration, specificity; kept in specificity.json) and the scorecard's Markdown. It reads the report's
tables and effects (hnclip.report) and writes nothing the report reads.
"""
