"""The ``resnorm-lm`` command: ``fit``/``validate``/``test`` (``train.lightning_cli``) and ``eval``, ``compare``,
``generate``, ``export``, ``at-init``, ``block-ratio``, ``layer-contribution``, ``depth-weights``, ``stream-gain``,
``attention-logits``, ``machines`` (the ``analysis`` wing).

    resnorm-lm fit --recipe prenorm-12l --profile auto [--seed_everything 1] [--ckpt_path last] [overrides]

``--recipe`` and ``--profile`` are shorthands for ``--config recipes/profiles/<profile>.yaml
--config recipes/<recipe>.yaml`` (profile first, recipe on top); everything else is LightningCLI.
``resnorm-lm --help`` lists the commands; ``resnorm-lm <command> --help`` shows one's options.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

from resnorm_lm.analysis.launchers import stop_with_compare
from resnorm_lm.errors import ResnormError
from resnorm_lm.train.checkpoint_io import CheckpointWriteError
from resnorm_lm.train.lightning_cli import ResnormCLI, check_checkpoint_argument
from resnorm_lm.train.preemption import Preempted
from resnorm_lm.train.recipes import expand_recipe_arguments
from resnorm_lm.train.runs import after_a_failed_checkpoint, release_all

TOOLS = {  # the commands beside LightningCLI's: "module:function", the function given the command's arguments
    "eval": "resnorm_lm.analysis.trained_run:eval_main",
    "compare": "resnorm_lm.analysis.compare:main",
    "suite": "resnorm_lm.analysis.suite:main",
    "generate": "resnorm_lm.analysis.trained_run:generate_main",
    "export": "resnorm_lm.analysis.trained_run:export_main",
    "at-init": "resnorm_lm.analysis.block_measurements:at_init_main",
    "block-ratio": "resnorm_lm.analysis.block_measurements:block_ratio_main",
    "layer-contribution": "resnorm_lm.analysis.block_measurements:layer_contribution_main",
    "depth-weights": "resnorm_lm.analysis.depth_weights:main",
    "stream-gain": "resnorm_lm.analysis.token_gain:main",
    "attention-logits": "resnorm_lm.analysis.attention_logits:main",
    "machines": "resnorm_lm.analysis.machines:main",
}
COMMANDS = {  # what `resnorm-lm --help` lists: LightningCLI's fit, validate and test, then the TOOLS
    "fit": "train a recipe at a profile (--recipe R --profile P), or resume one (--ckpt_path last)",
    "validate": "one pass over the validation split (LightningCLI; --ckpt_path a .ckpt file)",
    "test": "one pass over the test split (LightningCLI; --ckpt_path a .ckpt file)",
    "eval": "perplexity, bits per byte and word perplexity of trained runs, as a table",
    "compare": "sweep recipes over learning rates and warmups, pick on validation, report test at the pick",
    "suite": "train and render a pre-registered suite (recipes/suites/): one protocol, budget, seeds, intervals",
    "generate": "sample text from a trained run",
    "export": "a trained run as safetensors and JSON (and transformers' GPT-2 or OPT where it fits), no pickle",
    "at-init": "every placement at initialization: per-block gradient norms and stream RMS, no training",
    "block-ratio": "trained runs' last block over their first, per logged step (gradient norm or stream RMS)",
    "layer-contribution": "trained runs' blocks at their final weights: update RMS, angular distance, loss skipped",
    "depth-weights": "what AttnRes and DenseFormer runs learned to read: each reader's weights over earlier outputs",
    "stream-gain": "HC and mHC runs' composite gain of their stream mixes at their final weights, per token (mHC's)",
    "attention-logits": "trained runs' largest attention logit and attention entropy per block (what QK-norm bounds)",
    "machines": "which committed suites this machine can go on with (their runs' arithmetic is this machine's)",
}
USAGE = "usage: resnorm-lm <command> [options]   (resnorm-lm <command> --help: the command's options)"


class DropLightningTips(logging.Filter):
    """Lightning 2.6 advertises its cloud products ("💡 Tip: ...") at every Trainer start, with no setting to
    turn it off; the rest of what its rank-zero logger says (devices, "Seed set to") stays."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def quiet_libraries() -> None:
    """Silence what other libraries print at start-up that says nothing about the run."""
    tips = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # where rank_zero_info logs
    if not any(isinstance(f, DropLightningTips) for f in tips.filters):
        tips.addFilter(DropLightningTips())
    # Lightning's own _pytree still builds torch's deprecated LeafSpec: a warning for Lightning, not for users
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        category=FutureWarning,
        module=r"lightning\.pytorch\.utilities\._pytree",
    )


def command_list() -> str:
    width = max(map(len, COMMANDS))
    lines = [USAGE, "", "resnorm-lm: GPT LMs with swappable norms and residual placements", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a process of its own: stop with the compare that started it, if one did
        stop_with_compare()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):  # LightningCLI's own help would list only fit/validate/test
        print(command_list(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    quiet_libraries()
    if args[0] in TOOLS:
        import importlib

        module, function = TOOLS[args[0]].split(":")
        return getattr(importlib.import_module(module), function)(args[1:])
    try:
        args = expand_recipe_arguments(args)
        check_checkpoint_argument(args)
        if argv is None:
            sys.argv[1:] = args  # DDP relaunches sys.argv: the children get the resolved configs too
        cli = ResnormCLI(args=None if argv is None else args)
    except Preempted as stop:  # last.ckpt, eval.json and the RESULT line are written: leave now
        return stop.exit_code
    # what the user fixes (ResnormError), and jsonargparse's and Lightning's config errors (ValueError)
    except (ResnormError, ValueError, NotImplementedError) as err:
        if os.environ.get("RESNORM_LM_DEBUG"):
            raise
        advice = f"; {after_a_failed_checkpoint(err.path)}" if isinstance(err, CheckpointWriteError) else ""
        print(f"resnorm-lm: error: {err}{advice}", file=sys.stderr)
        return 2
    finally:
        release_all()  # however the fit ended, its run is free for the next call in this process
    return getattr(cli, "exit_code", 0)


if __name__ == "__main__":
    sys.exit(main())
