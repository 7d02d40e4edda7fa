#!/usr/bin/env bash
# make install's first step: ensure_venv.sh <python> <venv dir>
#
# Leaves a working virtual environment alone (its python starts and imports pip) and makes one where there is
# none. A half-made one (a `python -m venv` or pip install that was killed, the interpreter it links to removed
# or upgraded away) is removed and made again, so that `make install` repairs it instead of failing inside it.
set -euo pipefail
python=$1
venv=$2

if [ -e "$venv" ]; then
    if "$venv/bin/python" -c 'import sys, pip' >/dev/null 2>&1; then
        exit 0
    fi
    echo "make install: $venv is half made (its python does not start or has no pip): making it again" >&2
    rm -rf "$venv"
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    version=$("$python" -V 2>/dev/null) || version="not found"
    echo "make install: resnorm-lm needs Python 3.11 or newer; $python is ${version:-not found}." \
        "Name one: make install PYTHON=python3.11" >&2
    exit 2
fi
"$python" -m venv "$venv"
