"""The analysis wing: what is done with finished runs.

    trained_run.py         ``eval``, ``generate``, ``export``: one trained run's perplexity, samples and weights
    compare.py             ``compare``: its command line, checks and ``main``; compare.md, the CSVs and figures at
                           the picks; with depths, depth.md and its figures
    sweep.py               the grid, the selection rule, the rounds, the evaluations they need, the table rows,
                           the tuned overlays
    launchers.py           training a sweep's runs here: ``fit`` subprocesses (a stop passed on, time estimates)
    slurm_launcher.py      or as SLURM jobs (``--launcher slurm``), never two for one run
    suite.py               ``suite``: a pre-registered suite's file and designs
    drawn_recipes.py       a suite's recipes drawn from another suite's finished table, by a written rule
    suite_runner.py        training a suite's plan, ``jobs`` runs at a time, and the test split of its picks
    suite_report.py        the suite's tables (intervals, paired differences, failures) and figures
    depth_balance.py       the suite table's part on how its picks' blocks share the gradient and the stream
    gradient_record.py     the suite table's part on the global gradient norm over training and the clip
    stream_gain.py         the suite table's part on HC's and mHC's stream-mix gain over training
    reuse.py               ``suite --reuse``: another suite's finished runs taken where they are this suite's, bit
                           for bit (config and arithmetic fingerprint), instead of trained twice
    horizons.py            a second horizon beside its suite: each recipe's paired difference at both horizons,
                           the verdicts and which change
    equal_compute.py       the reference at a design's counted training FLOPs beside it at equal steps
    evidence.py            what a table may claim: t intervals, paired differences, Wilson's interval, the groups
                           they do not separate; whether its rows share one arithmetic (their provenance)
    plots.py               loss curves, LR sensitivity, gradient norms, the depth figures
    block_measurements.py  what each block does: ``at-init``, the loss when a block is skipped and its angular
                           distance (the curse of depth), ``block-ratio`` (the last block over the first)
    depth_weights.py       ``depth-weights``: what AttnRes and DenseFormer runs learned to read over depth
    token_gain.py          ``stream-gain``: HC's and mHC's composite gain at a run's final weights, per token
    machines.py            ``machines``: which committed suites this machine can go on with

Every run directory is read through ``resnorm_lm.train.runs.RunDir``.

Imports: ``train``, ``model``, ``data``, ``resnorm_lm.registry`` and ``resnorm_lm.errors``; nothing from ``cli``
(which imports this wing).
"""
