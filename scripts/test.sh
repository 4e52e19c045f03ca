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
# Two workers, whole files each (module-scoped engines stay shared within a file); each has
# its own temp dir (tests/conftest.py). PYTEST_WORKERS=0 runs in one process.
.venv/bin/python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadfile "$@"
