"""The package as a user gets it: a wheel built from this tree, installed in a fresh virtual
environment outside the checkout, loads and runs the real GGUF model (its C kernels built from
the installed sources into the cache, nothing written beside them) and starts its two commands.

CI runs the tests from the checkout, where every file is at hand; only this test sees what the
wheel leaves out. The new environment gets the third-party packages of the one running the
tests through a ``.pth`` line (the project itself is not among them: an editable install's
hook is a ``.pth`` file of that directory, and ``.pth`` files are read only in site
directories), and the real model and built kernels come from the shared test cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from aioengine.hub import ResolvedModel
from tests.smollm2 import SMOLLM2

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("aioengine", "transports")
# Read by people, not by the code: not shipped.
DOCS_ONLY = (".md",)
TIMEOUT = 300.0  # a first run on a fresh cache compiles every kernel (~30 s on 2 loaded cores)

GENERATE = """\
import json
import aioengine
from aioengine import LLM, EngineConfig, SamplingParams

if __name__ == "__main__":
    with LLM(EngineConfig(model={model!r}, max_model_len=256)) as llm:
        out = llm.chat([{{"role": "user", "content": "What is the capital of France?"}}],
                       SamplingParams(max_tokens=12, temperature=0), use_tqdm=False)[0]
    print(json.dumps({{"file": aioengine.__file__, "text": out.text,
                      "finish_reason": out.finish_reason}}))
"""


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, (f"{' '.join(cmd)} exited {done.returncode}\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return done


def source_files() -> set[str]:
    """Every file of the packages in this tree that is not bytecode, as a wheel names it."""
    out = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                out.add(path.relative_to(ROOT).as_posix())
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel`` of a copy of this tree (a build in the checkout would write ``build/``
    and ``*.egg-info`` into it), with the build tools of the running environment."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, src / package, ignore=junk)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--quiet", "--wheel-dir", str(base / "dist"), str(src)],
        cwd=base)
    (built,) = (base / "dist").glob("aioengine-*.whl")
    return built


def test_the_wheel_holds_every_file_the_code_reads(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    shipped = {n for n in source_files() if not n.endswith(DOCS_ONLY)}
    assert any(n.endswith(".c") for n in shipped)  # the walk found the kernels
    missing = sorted(shipped - names)
    assert not missing, f"the wheel leaves out {missing}: add them to package-data"


def installed_files(site: Path) -> set[str]:
    return {p.relative_to(site).as_posix() for package in PACKAGES
            for p in (site / package).rglob("*") if "__pycache__" not in p.parts}


def test_the_installed_wheel_runs_the_real_model_outside_the_checkout(
        tmp_path: Path, wheel: Path, smollm2: ResolvedModel) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--disable-pip-version-check", "--quiet", str(wheel)], cwd=tmp_path)
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                     "['purelib'])"], cwd=tmp_path).stdout.strip())
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "aioengine-test-deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    before = installed_files(site)

    (tmp_path / "generate.py").write_text(GENERATE.format(model=SMOLLM2))
    done = run([str(python), "generate.py"], cwd=tmp_path, env=env)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).is_relative_to(site), got["file"]
    assert not Path(got["file"]).is_relative_to(ROOT)
    assert "Paris" in got["text"] and got["finish_reason"] == "stop", got
    # The kernels were built into (or found in) the cache, not beside their installed sources.
    assert installed_files(site) == before

    for cmd in ([str(python), "-m", "aioengine.serve", "--help"],
                [str(python), "-m", "aioengine.bench", "--help"],
                [str(venv / "bin" / "aioengine-serve"), "--help"]):
        assert "usage:" in run(cmd, cwd=tmp_path, env=env).stdout, cmd
