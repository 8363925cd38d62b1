#!/usr/bin/env bash
# Starts the demo payment API (FastAPI on uvicorn, with pg-idempotency from
# ../src) in the foreground: demo/start.sh --port N --port-file F --max-seconds S [--bench] [--no-prepare]
# It connects with libpq's environment (PGHOST, PGPORT, PGUSER, PGDATABASE).
# The first run creates its virtual environment (scripts/venv.sh).
set -euo pipefail
demo="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$demo/../scripts/venv.sh"
venv="$(idem_py_venv)"
export PYTHONPATH="$idem_py_root/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" "$demo/app.py" "$@"
