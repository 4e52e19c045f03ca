"""llama.cpp's own ``convert_hf_to_gguf.py`` (with its ``conversion`` package and ``gguf-py``),
vendored in the ``llama-cpp-python`` sdist the bench's peers suite builds llama.cpp from: a
Hugging Face directory -> the GGUF file llama.cpp writes of it, the oracle for our GGUF reading.

The sdist is downloaded once (``pip download``) and only the converter's files are kept, as a
small tar in the model cache (``<cache>/models/llama-cpp-convert-<version>``); each test
session unpacks that into its own temporary directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from aioengine.bench.peers.llama_cpp import SDIST
from aioengine.hub.cache import ensure_dir

_VERSION = SDIST.split("==")[1]
_TAR = "convert.tar"
_KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
CONVERT_TIMEOUT = 600.0

# Two patches, neither changing what is written for our test models: (1) the converter names
# the tokenizer's pre-tokenizer by hashing its output on a fixed text, and refuses one it does
# not know; our test models carry the built-in tiny model's byte-level BPE tokenizer, whose
# pre-tokenizer is GPT-2's regex (tokenizer_build.py): say so. (2) Llama's converter tries a
# SentencePiece ``tokenizer.model`` first and falls back to tokenizer.json when the file is
# absent, but imports sentencepiece (not installed here) before looking: look first.
_WRAPPER = """
import runpy, sys
root = sys.argv.pop(1)
sys.path[0:0] = [root, root + "/gguf-py"]
import conversion.base
base = conversion.base.TextModel
base.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
spm = base._set_vocab_sentencepiece
def no_spm(self, *args, **kwargs):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return spm(self, *args, **kwargs)
base._set_vocab_sentencepiece = no_spm
sys.argv[0] = root + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def converter_tar() -> str:
    """The cached tar of the converter's files (downloading the sdist on first use)."""

    def build(out_dir: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                            ":all:", SDIST, "-d", tmp], check=True, capture_output=True,
                           timeout=600, stdin=subprocess.DEVNULL)
            sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
            prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
            with tarfile.open(sdist) as src, tarfile.open(os.path.join(out_dir, _TAR),
                                                          "w") as dst:
                for member in src:
                    rel = member.name.removeprefix(prefix)
                    if member.isfile() and rel != member.name and rel.startswith(_KEEP):
                        data = src.extractfile(member)
                        member.name = rel
                        dst.addfile(member, data)

    return os.path.join(ensure_dir(f"llama-cpp-convert-{_VERSION}", build), _TAR)


def unpack_converter(dest: str) -> str:
    """The converter's files unpacked under ``dest``; returns that directory."""
    with tarfile.open(converter_tar()) as tar:
        tar.extractall(dest, filter="data")
    return dest


def convert(converter: str, hf_dir: str, out_path: str, outtype: str = "f32") -> None:
    """``convert_hf_to_gguf.py hf_dir --outfile out_path --outtype outtype``; AssertionError
    with the converter's output when it fails."""
    cmd = [sys.executable, "-c", _WRAPPER, converter, hf_dir, "--outfile", out_path,
           "--outtype", outtype]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=CONVERT_TIMEOUT,
                          stdin=subprocess.DEVNULL, check=False, env=env)
    assert done.returncode == 0, f"convert_hf_to_gguf failed:\n{done.stderr[-4000:]}"
