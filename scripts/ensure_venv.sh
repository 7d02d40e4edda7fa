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
# A new environment takes about 2.5 GB (torch 0.75, triton 1.0, the rest 0.75; measured on Linux x86_64 with the
# CPU build of torch): a disk with less free space is refused here, before pip fills it and stops half way.
needs_mb=${RESNORM_LM_INSTALL_NEEDS_MB:-2700}
free_mb=$(df -Pm "$(dirname "$venv")" 2>/dev/null | awk 'NR == 2 {print $4}')
if [ -n "$free_mb" ] && [ "$free_mb" -lt "$needs_mb" ]; then
    echo "make install: the environment needs about $needs_mb MB and only $free_mb MB are free on the disk" \
        "that holds $venv. Free some space (pip cache purge; old runs under runs/) and run make install again." >&2
    exit 2
fi
"$python" -m venv "$venv"
