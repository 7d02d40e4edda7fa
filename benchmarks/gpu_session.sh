#!/usr/bin/env bash
# The GPU session's entry: benchmarks/gpu_session.py runs the stages (its docstring, or --help, says what each does).
#
#   bash benchmarks/gpu_session.sh prepare             # once, on a networked machine: .whl/, .devcache/, .devseed/
#   bash benchmarks/gpu_session.sh quick               # on the GPU machine, the first command (about 5 minutes)
#   bash benchmarks/gpu_session.sh suite -- placements-12l   # a suite's next chunk (9 min; its runs: to .devseed/)
#   bash benchmarks/gpu_session.sh --dry-run quick     # on a CPU: the stage's plumbing at tiny sizes
#
# On the GPU machine, python3 is the image's interpreter with torch (PY overrides it). prepare runs with the
# project's .venv (made or brought up to date by `make install`), which has torch and tokenizers: a bare python3
# there has neither.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
case " $* " in
    *" --dry-run "*) ;;
    *" prepare "*) make -s install && PY=.venv/bin/python ;;
esac
exec "$PY" benchmarks/gpu_session.py "$@"
