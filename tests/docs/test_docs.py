"""The documentation site stays true to the code.

``mkdocs build --strict`` (run by scripts/test.sh) already fails on broken links, missing
anchors and pages left out of the nav. These tests cover what the build cannot see: Python
snippets that no longer compile, objects in the API reference without docstrings, and tables
of command-line flags and metric names that drift from the code.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import griffe
import msgspec
import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROOT = DOCS.parent


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def python_blocks(page: Path) -> list[tuple[int, str]]:
    """(line number, source) of every fenced ```python block."""
    blocks, current, start = [], None, 0
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if current is None and line.strip() == "```python":
            current, start = [], number
        elif current is not None and line.strip() == "```":
            blocks.append((start, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def table_column(page: str, heading: str, pattern: str) -> set[str]:
    """Every match of ``pattern`` in the first column of the tables under ``heading`` (up to
    the next heading of the same or a higher level; ``#`` lines in code blocks are not
    headings)."""
    level = len(heading.split(" ", 1)[0])
    inside, fenced = False, False
    found: set[str] = set()
    for line in (DOCS / page).read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line == heading:
            inside = True
            continue
        heading_match = re.match(r"(#+) ", line)
        if inside and heading_match and len(heading_match.group(1)) <= level:
            break
        if inside and line.startswith("| ") and not line.startswith("|---"):
            found.update(re.findall(pattern, line.split("|")[1]))
    return found


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_python_snippets_compile(page: Path) -> None:
    for line, source in python_blocks(page):
        try:
            compile(source, f"{page.name}:{line}", "exec")
        except SyntaxError as exc:
            pytest.fail(f"{page.relative_to(DOCS)} line {line}: the python block does not "
                        f"compile: {exc}")


def test_python_snippets_exist() -> None:
    """The parser above finds the blocks (so the compile test cannot pass vacuously)."""
    assert len(python_blocks(DOCS / "index.md")) >= 2
    assert len(python_blocks(DOCS / "transports.md")) >= 1


def reference_directives() -> list[tuple[str, str, list[str]]]:
    """(page, object path, listed members) for every ``::: path`` in docs/reference."""
    found = []
    for page in sorted((DOCS / "reference").glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("::: "):
                continue
            members = []
            for option in lines[i + 1:]:
                if not option.startswith("    "):
                    break
                m = re.fullmatch(r"\s+- (\w+)", option)
                if m:
                    members.append(m.group(1))
            found.append((page.name, line[4:].strip(), members))
    return found


def test_reference_objects_have_docstrings() -> None:
    """Every object the API reference renders, and every public member of a rendered class,
    has a docstring; otherwise the reference shows a bare name."""
    loader = griffe.GriffeLoader(search_paths=[str(ROOT)])
    loader.load("aioengine")
    loader.load("transports")
    directives = reference_directives()
    assert len(directives) >= 20, directives
    missing = []
    for page, path, members in directives:
        obj = loader.modules_collection[path]
        if members:
            targets = [obj[name] for name in members]
        elif obj.is_module:
            targets = [obj, *(m for m in obj.members.values()
                              if not m.name.startswith("_") and not m.is_alias and m.is_class)]
        else:
            targets = [obj]
        for target in targets:
            if not target.docstring:
                missing.append(f"{page}: {target.path}")
            if target.is_class:
                missing += [f"{page}: {m.path}" for m in target.members.values()
                            if not m.name.startswith("_") and not m.is_alias
                            and not m.docstring]
    assert not missing, "no docstring (the API reference would show a bare name):\n" + \
        "\n".join(missing)


def test_serve_flags_match_the_parser() -> None:
    from aioengine.server.__main__ import build_parser

    parser = build_parser()
    server = next(g for g in parser._action_groups if g.title == "server")
    actual = {opt for a in server._group_actions for opt in a.option_strings
              if opt.startswith("--")}
    documented = table_column("serving.md", "## Running the server", r"`(--[a-z-]+)`")
    assert documented == actual, (f"documented only: {sorted(documented - actual)}; "
                                  f"undocumented: {sorted(actual - documented)}")
    engine_flags = {opt for a in parser._actions for opt in a.option_strings}
    text = (DOCS / "serving.md").read_text(encoding="utf-8")
    intro = text[text.index("## Running the server"):text.index("| flag |")]
    for flag in re.findall(r"`(--[a-z-]+)`", intro):
        assert flag in engine_flags, f"serving.md names {flag}, which the server does not take"


def test_metric_names_match_the_exposition() -> None:
    from aioengine import EngineStats
    from aioengine.messages import ProcessMemory
    from aioengine.server.metrics import ServerMetrics

    metrics = ServerMetrics("m")
    metrics.count("chat", "stop")
    metrics.first_token(0.1)
    metrics.inter_token(0.01)
    metrics.finished(1.0)
    metrics.engine.stats = EngineStats(
        num_running=1, num_waiting=0, num_preempted_total=0, kv_blocks_used=1,
        kv_blocks_total=2, prefix_cache_hit_rate=0.5, prompt_tokens_total=3,
        generation_tokens_total=4,
        processes=[ProcessMemory(role="engine", pid=1, rss_bytes=2)])
    replica = msgspec.structs.replace(metrics.engine.stats)
    metrics.engine.stats = msgspec.structs.replace(  # two replicas: the per-replica series too
        metrics.engine.stats, data_parallel_size=2, replicas_alive=1, replicas=[replica, None])
    exposed = set()
    for line in metrics.render().decode().splitlines():
        if line.startswith("#") or not line:
            continue
        name = re.match(r"[a-z_:]+", line).group(0)
        if not name.endswith("_created"):  # a timestamp beside every counter and histogram
            exposed.add(re.sub(r"_(bucket|sum|count)$", "", name))
    documented = table_column("serving.md", "## Metrics", r"`(aioengine_[a-z_]+|vllm:[a-z_]+)")
    assert documented == exposed, (f"documented only: {sorted(documented - exposed)}; "
                                   f"undocumented: {sorted(exposed - documented)}")


def test_bench_options_exist() -> None:
    from aioengine.bench import suites
    from aioengine.bench.__main__ import parse_args

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_args(["--help"])
    options = set(re.findall(r"(--[a-z-]+)", out.getvalue()))
    documented = table_column("benchmarks.md", "# Benchmarks", r"`(--[a-z-]+)")
    assert documented, "no options found in the benchmarks page's table"
    assert documented <= options, f"not options of the bench: {sorted(documented - options)}"
    for suite in re.findall(r"^## `([a-z]+)`", (DOCS / "benchmarks.md").read_text(), re.M):
        assert suite in suites.suite_names(), f"benchmarks.md documents unknown suite {suite!r}"


def test_engine_config_fields_in_docs_exist() -> None:
    """``EngineConfig(name=...)`` in any page names a real field."""
    import dataclasses

    from aioengine import EngineConfig

    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    for page in pages():
        for call in re.findall(r"EngineConfig\(([^()]*)\)", page.read_text(encoding="utf-8")):
            for name in re.findall(r"(\w+)\s*=", call):
                assert name in fields, f"{page.name}: EngineConfig has no field {name!r}"


def test_every_cpu_kernel_switch_is_in_the_engine_page() -> None:
    """The CPU backend's table in docs/engine.md lists every ``CpuKernelConfig`` field, and
    each row's flag is one ``python -m aioengine.serve`` takes."""
    import dataclasses

    from aioengine.config import CpuKernelConfig
    from aioengine.server.__main__ import build_parser

    heading = "### The CPU backend and its switches"
    documented = table_column("engine.md", heading, r"`([a-z_0-9]+)`")
    assert documented == {f.name for f in dataclasses.fields(CpuKernelConfig)}
    known = {opt for action in build_parser()._actions for opt in action.option_strings}
    page = (DOCS / "engine.md").read_text(encoding="utf-8").split(heading, 1)[1]
    rows = [line for line in page.split("\n#", 1)[0].splitlines() if line.startswith("| `")]
    flags = {m for row in rows for m in re.findall(r"`(--[a-z][a-z0-9-]+)", row)}
    assert len(flags) == len(rows) and flags <= known, sorted(flags - known)


def test_deploying_examples_use_real_serve_flags() -> None:
    from aioengine.server.__main__ import build_parser

    known = {opt for action in build_parser()._actions for opt in action.option_strings}
    used = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", (DOCS / "deploying.md").read_text()))
    assert used, "no flags found"
    assert used <= known, f"unknown flags: {sorted(used - known)}"



ENV_NAME = re.compile(r"AIOENGINE_[A-Z0-9_]*[A-Z0-9]")


def test_every_environment_variable_the_code_reads_is_documented() -> None:
    """docs/operations.md lists every ``AIOENGINE_*`` name the package and the tests read, and
    no name the code no longer reads."""
    package = [*ROOT.glob("aioengine/**/*.py"), *ROOT.glob("transports/**/*.py")]
    code = {m for p in package for m in ENV_NAME.findall(p.read_text(encoding="utf-8"))}
    for path in ROOT.glob("tests/**/*.py"):  # what the tests read, not names they make up
        for line in path.read_text(encoding="utf-8").splitlines():
            if "environ.get(" in line or "getenv(" in line:
                code |= set(ENV_NAME.findall(line))
    page = (DOCS / "operations.md").read_text(encoding="utf-8")
    section = page.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    documented = set(ENV_NAME.findall(section))
    assert code - documented == set(), "read by the code, missing from docs/operations.md"
    assert documented - code == set(), "documented, read by no code"


def test_model_family_tables_list_every_supported_architecture() -> None:
    """docs/models.md's tables of families: every HF architecture the engine reads, and every
    GGUF architecture it maps, no more and no fewer."""
    from aioengine.hub.gguf_families import ARCHITECTURES
    from aioengine.worker.models.spec import SUPPORTED_ARCHITECTURES

    hf = table_column("models.md", "## Architectures", r"`(\w+ForCausalLM)`")
    assert hf == set(SUPPORTED_ARCHITECTURES)
    gguf = table_column("models.md", "### From GGUF files", r"`([a-z0-9]+)`")
    assert gguf == set(ARCHITECTURES)
