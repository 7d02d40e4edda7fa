"""The training wing: everything between a recipe and a finished run directory.

    lightning_cli.py     ResnormCLI: LightningCLI with recipes, profiles, precision, resume checks
    lightning_module.py  LanguageModel, the GPT as a LightningModule
    trainer.py, optim.py, precision.py       the Trainer, AdamW groups, ``precision: auto``
    schedules.py                             the LR schedules by name, warmup and cooldown as fractions of the run
    arithmetic.py                            what sets a run's arithmetic, its fingerprint, the portable setting
    recipes.py, runs.py, resume.py           recipe/profile files, run directories and manifests, resume rules
    loaded_run.py                            a trained run loaded back (model, data, where it came from)
    checkpoint_io.py                         checkpoint files: read as data (weights only), written atomically
    checkpoint_callbacks.py, preemption.py   periodic and final checkpoints at good states; saving on SIGTERM (and
                                             on SLURM's warning, then requeueing)
    divergence.py                            the divergence guard: one rule, applied on the device or read on the host
    step_boundary.py                         where an optimizer step ends under gradient accumulation
    config_checks.py                         numeric, hardware and memory checks before any work
    monitors.py, logging.py, diagnostics.py  throughput, the CSV logger, per-layer gradient norms
    summary.py                               the end-of-run evaluation, RESULT line and sample
    slurm.py                                 under SLURM: Lightning's environment, the warning signal, requeue, resume

Imports: ``model``, ``data`` and ``resnorm_lm.registry``; nothing from ``analysis`` or ``cli``.
"""
