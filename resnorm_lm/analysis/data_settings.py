"""The data settings a ``fit`` command resolves to, found without building the CLI.

``resnorm-lm fit --recipe R --profile P <overrides>`` reads its ``data`` group from the config files
``expand_recipe_arguments`` puts first (the profile, the recipe, its tuned overlay) and then from the
command line, in order, later values winning. ``data_settings`` reads the same arguments the same way: the
``data`` section of each ``--config`` file and each ``--data...`` option, in command-line order, through the
parser LightningCLI builds for its ``data`` group (``TextDataModule``'s signature: its types and defaults).
What it returns is the ``data`` section ``--print_config`` prints (tests/test_sweep.py checks the two agree).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

CONFIG_OPTIONS = ("--config", "-c")


def data_settings(recipe: str, profile: str, extra: list[str]) -> dict[str, Any] | None:
    """The ``data`` section that ``fit --recipe <recipe> --profile <profile> <extra>`` resolves to (None when
    its data arguments do not parse: each job then reports its own config error)."""
    from lightning.pytorch.cli import LightningArgumentParser

    from resnorm_lm.data.datamodule import TextDataModule
    from resnorm_lm.train.recipes import expand_recipe_arguments

    args = expand_recipe_arguments(["fit", "--recipe", recipe, "--profile", profile, *extra], say=False)
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(TextDataModule, "data")
    try:
        settings = parser.parse_object({})  # TextDataModule's defaults
        for source in data_sources(args):
            if isinstance(source, dict):
                settings = parser.parse_object({"data": source}, settings)
            else:
                settings = parser.parse_args(source, namespace=settings)
    except (argparse.ArgumentError, OSError, yaml.YAMLError):
        return None
    return settings.data.as_dict()


def data_sources(args: list[str]) -> Iterator[dict[str, Any] | list[str]]:
    """What sets ``data``, in command-line order: each config file's ``data`` section (a dict), and each
    ``--data...`` option with its value (``["--data.KEY=VALUE"]``). Every such option takes one value, given
    after ``=`` or as the next argument."""
    i = 0
    while i < len(args):
        name, has_value, value = args[i].partition("=")
        if name in CONFIG_OPTIONS or name == "--data" or name.startswith("--data."):
            if not has_value and i + 1 < len(args):
                i, value = i + 1, args[i + 1]
            if name in CONFIG_OPTIONS:
                section = (yaml.safe_load(Path(value).read_text()) or {}).get("data")
                if isinstance(section, dict):
                    yield section
            else:
                yield [f"{name}={value}"]
        i += 1
