#!/usr/bin/env bash
# The one test command (README and CI): lint, the docs build, then the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The chat-page test drives a real headless Chromium; it skips with the reason if this fails.
bash scripts/install_browser.sh || echo "test.sh: chromium could not be installed" >&2
.venv/bin/ruff check .
site_dir=$(mktemp -d)
trap 'rm -rf "$site_dir"' EXIT
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site_dir"
# Byte-compile the package before the suite: where PYTHONDONTWRITEBYTECODE is set (an editable
# install writes no .pyc) every spawned engine and worker compiled the ~90 modules it imports
# from source, ~0.28 s of CPU each; an A/B on two engine-heavy test files took 5-12% less time
# with the .pyc present. compileall rewrites only stale files and Python checks each .pyc
# against its source's mtime and size, so an edited module is never run from an old .pyc.
.venv/bin/python -m compileall -q aioengine transports
# Two workers, whole files each (module-scoped engines stay shared within a file); each has
# its own temp dir (tests/conftest.py). PYTEST_WORKERS=0 runs in one process.
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
