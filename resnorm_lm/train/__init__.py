"""The training wing: everything between a recipe and a finished run directory.

    lightning_cli.py     ResnormCLI: LightningCLI with recipes, profiles, precision, resume checks
    lightning_module.py  LanguageModel, the GPT as a LightningModule
    optim.py             AdamW's parameter groups and the LR schedules by name (warmup, cooldown: fractions of the run)
    precision.py         ``precision: auto`` (the bf16 probe) and the Trainer that takes it; TF32 on CUDA
    hardware.py          the CPU's features, timing on one thread, measurements kept per machine
    cpu_attention.py     the CPU attention kernel, measured (or named)
    arithmetic.py        what sets a run's arithmetic, its fingerprint, the portable setting
    recipes.py           recipe, profile and tuned-overlay files, resolved to LightningCLI's --config arguments
    runs.py              run directories (RunDir, the one reader), their lock, manifest, eval.json and RESULT line
    resume.py            what a resume must share with its checkpoint
    config_checks.py     numeric, hardware and memory checks before any work
    loaded_run.py        a trained run loaded back (model, data, where it came from)
    checkpoint_io.py     checkpoint files: read as data (weights only), written atomically
    callbacks.py         step boundaries, checkpoints at good states, throughput, the continued metrics.csv
    divergence.py        the divergence guard: one rule, applied on the device or read on the host
    preemption.py        saving on SIGTERM, Ctrl-C or SLURM's warning, and SLURM's requeue and resume
    diagnostics.py       per-layer gradient norms, the stream's RMS per block, the clip record

Imports: ``model``, ``data``, ``resnorm_lm.registry`` and ``resnorm_lm.errors``; nothing from ``analysis`` or
``cli``.
"""
