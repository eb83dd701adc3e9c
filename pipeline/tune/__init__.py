"""`lpx tune`: which variant and which build limits serve an SLO best, by measurement (docs/tune.md).

space.py   the cells (variants x the grid of build limits) and what is pruned before any build
search.py  the goodput search of one cell: closed-loop concurrency up to the knee, then Poisson rates
cells.py   measuring one cell (built and served here, or a remote OpenAI-compatible server), cached
answer.py  per SLO: the figures, the Pareto front, the best cell, its lpx.yaml
report.py  tune.md and the plots
run.py     the whole command: gate, measure with progress and time left, write the answer
"""
