"""The analysis wing: what is done with finished runs.

    evaluate.py            ``resnorm-lm eval``: a checkpoint on a split, with its data identity checked
    at_init.py             ``resnorm-lm at-init``: every placement at initialization
    compare.py             ``resnorm-lm compare``: its command line, checks and ``main``; the rooms it calls:
      sweep.py               the grid, the selection rule, the not-learning flag (decides only)
      sweep_rounds.py        the rounds: the grid, then every seed at the picks until the choice is stable
      sweep_runner.py        training a sweep's runs as ``fit`` subprocesses, and the time estimate
      sweep_slurm.py         ... or as SLURM jobs (``--launcher slurm``), never two for one run
      slurm_options.py       what those jobs ask SLURM for: the site's config file, then ``--slurm-*``
      data_settings.py       the data a ``fit`` command resolves to (prepared once before parallel jobs)
      eval_records.py        which evaluations a run's eval.json holds; measuring the missing ones
      tables.py              the rows of compare.csv and grid.csv (reading only)
      report.py              compare.md, the CSVs and the figures at the picks
      tuned_overlays.py      tuned/<recipe>.yaml: each pick as a recipe overlay, with its evidence
      depth_report.py        the depth axis: depth.md/.csv, its figures, the layer contribution at the picks
      (every run directory is read through ``resnorm_lm.train.runs.RunDir``)
    suite.py               ``resnorm-lm suite``: a pre-registered comparison trained and rendered; its rooms:
      suite_file.py          the suite file (recipes/suites/<name>.yaml), read and checked
      suite_designs.py       what a suite trains: the budget algorithm (tuned), the seed pilot (seeds)
      suite_runner.py        training the design's plan, jobs at a time, in the suite's arithmetic
      suite_report.py        its tables: means, paired differences and failure rates with their intervals
      suite_plots.py         its figures: LR sensitivity per recipe, the paired differences, the seed spread
    intervals.py           t intervals, paired differences, Wilson's interval, the groups they do not separate
    provenance.py          whether runs share one arithmetic (their fingerprints), and a table's provenance lines
    plots.py               loss curves, LR sensitivity, gradient norms, the depth figures
    layer_contribution.py  the curse-of-depth measurement (loss when a block is skipped, angular distance)
    generate.py            ``resnorm-lm generate``: sample text from a trained run

Imports: ``train``, ``model`` and ``data``; nothing from ``cli`` (which imports this wing).
"""
