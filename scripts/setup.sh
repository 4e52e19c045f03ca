#!/usr/bin/env bash
# Idempotent set-up: a .venv in the repo root, torch 2.13.0 (CPU build where no GPU) first so
# no CUDA wheels are pulled, then the package in editable mode with its dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.aioengine-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
    echo "$want" > "$stamp"
fi
# The editable install has no bytecode, and PYTHONDONTWRITEBYTECODE (set in some environments)
# keeps Python from caching it: every process would compile our modules from source again
# (~0.1 s of the host's start-up, ~0.3 s of CPU in every engine and worker, the tests' too).
# Cheap when up to date; Python checks each .pyc against its source's mtime and size.
.venv/bin/python -m compileall -q aioengine transports >/dev/null
