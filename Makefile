# Every target sets up .venv first (idempotent, fast when nothing changed).
PY := .venv/bin/python

.PHONY: setup bench chat test lint docs clean

setup:
	@bash scripts/setup.sh

bench: setup
	$(PY) -m aioengine.bench --quick

chat: setup
	$(PY) examples/chat_terminal.py

test: setup
	bash scripts/test.sh

lint: setup
	.venv/bin/ruff check .

docs: setup
	NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf site .pytest_cache .ruff_cache
