"""The analysis wing: what is done with finished runs.

    evaluate.py            ``resnorm-lm eval``: a checkpoint on a split, with its data identity checked
    compare.py, sweep.py   ``resnorm-lm compare``: per-recipe LR grids, the selection rule, tables, depths
    plots.py               loss curves, LR sensitivity, gradient norms, the depth figures
    layer_contribution.py  the curse-of-depth measurement (loss when a block is skipped, angular distance)
    generate.py            ``resnorm-lm generate``: sample text from a trained run

Imports: ``train``, ``model`` and ``data``; nothing from ``cli`` (which imports this wing).
"""
