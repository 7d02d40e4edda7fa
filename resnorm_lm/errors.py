"""The one base of every error a user fixes: ``ResnormError``.

Each wing raises its own subclass (``DataError``, ``RecipeError``, ``CheckpointError``, ...), whose message says
what is wrong and what to do; the command layer (``resnorm_lm/cli.py`` and each command's ``main``) prints that
message in one line, without a traceback, and exits 2. Anything else is a bug, and keeps its traceback.
"""

from __future__ import annotations


class ResnormError(Exception):
    """An error the user fixes: its message says what was wrong and how to fix it."""
