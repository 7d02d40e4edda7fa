"""``resnorm-lm export``: a trained run's weights out of its Lightning checkpoint, into a folder other tools read.

    resnorm-lm export runs/prenorm-12l/cpu-seed1 exports/prenorm-12l

The folder (``resnorm_lm/model/exported.py``): ``model.safetensors`` (weights only, no pickle), ``resnorm_lm.json``
(the model's config, the run, its data), the tokenizer (``tokenizer.json``, with a ``tokenizer_config.json`` that
``transformers.AutoTokenizer`` reads) and, for pre-norm and post-norm with LayerNorm, the ``config.json`` of
transformers' GPT-2 or OPT, so that ``AutoModelForCausalLM.from_pretrained(folder)`` gives this model's logits.
``resnorm-lm eval``, ``generate`` and ``fit --model.init_from=<folder>`` read it back without pickle.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from resnorm_lm.data.cache import atomic_write
from resnorm_lm.data.tokenizer import EOT
from resnorm_lm.errors import ResnormError
from resnorm_lm.model import exported
from resnorm_lm.train.lightning_module import data_identity
from resnorm_lm.train.loaded_run import load_run


def tokenizer_files(tokenizer, block_size: int) -> dict[str, bytes]:
    """The tokenizer as transformers' fast tokenizer reads it: the ``tokenizers`` file as it is, and a config that
    names the class (without it transformers rebuilds a GPT-2 tokenizer from the vocabulary, dropping what the
    file says about normalizing and splitting) and the end-of-text token."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOT,
        "bos_token": EOT,
        "clean_up_tokenization_spaces": False,
        "model_max_length": block_size,
    }
    return {"tokenizer.json": tokenizer.to_str().encode(), "tokenizer_config.json": json.dumps(config).encode()}


def export(run_path: str, folder: Path) -> tuple[str, str]:
    """Write ``run_path``'s export into ``folder``; its layout and why."""
    run = load_run(run_path)  # the final weights, and the data (and tokenizer) the run trained on, checked
    gpt, dm = run.model.model, run.datamodule
    extra = {
        "run": {
            "source": str(run.checkpoint),
            "step": run.global_step,
            "precision": run.precision,
            "run_dir": str(run.run_dir) if run.run_dir else None,
        },
        "data": {k: v for k, v in dm.hparams.items() if not k.startswith("_")},
        "data_identity": data_identity(dm.manifest),
    }
    layout, files = exported.files(gpt, dm.manifest.eot_id, extra)
    files.update(tokenizer_files(dm.prepared.tokenizer, gpt.config.block_size))
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        with atomic_write(folder / name, "wb") as f:
            f.write(content)
    return layout, exported.layout_for(gpt.config)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="resnorm-lm export", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", help="a run directory (its last.ckpt) or a .ckpt file")
    parser.add_argument("folder", help="where the export goes (made; an earlier export there is replaced)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if folder.is_file() or (folder.is_dir() and any(folder.iterdir()) and not exported.is_export(folder)):
        print(
            f"resnorm-lm export: error: {folder} exists and is not an export: choose an empty folder", file=sys.stderr
        )
        return 2
    try:
        layout, why = export(args.run, folder)
    except ResnormError as err:
        print(f"resnorm-lm export: error: {err}", file=sys.stderr)
        return 2
    print(f"resnorm-lm export: wrote {folder} ({layout} layout: {why})")
    if layout != "resnorm_lm":
        print(
            f"  transformers: AutoModelForCausalLM.from_pretrained({str(folder)!r}), "
            f"AutoTokenizer.from_pretrained({str(folder)!r})"
        )
    print(
        f"  resnorm-lm: resnorm-lm eval {folder}; resnorm-lm generate {folder}; "
        f"resnorm-lm fit ... --model.init_from={folder}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
