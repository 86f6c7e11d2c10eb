"""The report: every table of the paper (CSV, Markdown, LaTeX and a provenance record per table,
`build`, `tables`, `render`, `paper_reference`), the figures, each table's contrasts with their intervals
(`effects`), caption geometry, the gradient figures' statistics and the regime report. The library side
of one concept at two layers: the command that builds a table or a figure (`hnclip table`, `hnclip
figure`) is `hnclip.commands.report`.
"""
