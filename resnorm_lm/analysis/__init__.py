"""The analysis wing: what is done with finished runs.

    evaluate.py            ``resnorm-lm eval``: a checkpoint on a split, with its data identity checked
    generate.py            ``resnorm-lm generate``: sample text from a trained run
    compare.py             ``resnorm-lm compare``: its command line, checks and ``main``
      sweep.py               the grid, the selection rule, the rounds, the evaluations they need, the table rows,
                             the tuned overlays
      fit_processes.py       training a sweep's runs as ``fit`` subprocesses here, a stop passed on, time estimates
      slurm_jobs.py          ... or as SLURM jobs (``--launcher slurm``), never two for one run
      compare_report.py      compare.md, the CSVs and figures at the picks; with depths, depth.md and its figures
    suite.py               ``resnorm-lm suite``: a pre-registered suite's file, designs and training
      suite_report.py        its tables (intervals, paired differences, failures) and figures
    intervals.py           t intervals, paired differences, Wilson's interval, the groups they do not separate
    provenance.py          whether runs share one arithmetic (their fingerprints), and a table's provenance lines
    plots.py               loss curves, LR sensitivity, gradient norms, the depth figures
    layer_contribution.py  the curse-of-depth measurement (loss when a block is skipped, angular distance)
    block_ratio.py         the last block's per-block metric over the first's, through training
    at_init.py             ``resnorm-lm at-init``: every placement at initialization

Every run directory is read through ``resnorm_lm.train.runs.RunDir``.

Imports: ``train``, ``model``, ``data``, ``resnorm_lm.registry`` and ``resnorm_lm.errors``; nothing from ``cli``
(which imports this wing).
"""
