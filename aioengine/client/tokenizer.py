"""The host's tokenizer: the ``tokenizers`` library directly (never transformers, which imports
torch), plus the special tokens and chat template from ``tokenizer_config.json``."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import sniffio

from aioengine.client.chat_template import ChatMessage, ChatTemplate, pick_template
from aioengine.runtime.malloc_trim import release_freed_memory
from aioengine.text.detokenize import REPLACEMENT, IncrementalDetokenizer, load_hf_tokenizer

# tokenizers is imported where a tokenizer is built: the server imports this module before it
# spawns the engine, and loads its tokenizer after, while the engine starts.
if TYPE_CHECKING:
    from tokenizers import Tokenizer as HFTokenizer

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # sentencepiece's byte fallback


def _byte_level_chars() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's ``bytes_to_unicode``), read backwards: the byte each
    character of a token's vocabulary entry stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    chars = {chr(b): b for b in printable}
    shifted = (b for b in range(256) if b not in chars.values())
    chars.update({chr(256 + n): b for n, b in enumerate(shifted)})
    return chars


def _token_text(value: Any) -> str | None:
    """Special tokens in tokenizer_config.json are strings or AddedToken dicts."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


# Texts longer than this are tokenized so that other threads run meanwhile (``encode``), and
# ``AsyncMPClient`` templates and tokenizes them in a worker thread, off its event loop.
LONG_TEXT_CHARS = 16384
# After tokenizing a text longer than this, freed memory is handed back to the system: the
# tokenizer's allocations for one long text (ids, offsets, masks, token strings: many times the
# text's size) stayed in glibc's per-thread arenas, and a server's memory grew with every long
# message and never came back. malloc_trim costs a fraction of tokenizing such a text, in the
# thread that tokenized (figures: docs/benchmarks.md).
TRIM_AFTER_CHARS = 1 << 18
# Long texts are templated and tokenized in this many threads of their own, not the loop's
# default executor (up to 32 threads): one 3.9 MB text peaks near 1 GB in the tokenizer, and
# six at once took a server to 6.2 GB. More wait their turn (off the event loop).
LONG_TEXT_WORKERS = 2

_T = TypeVar("_T")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


async def run_long_text(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)`` in the long-text pool (``LONG_TEXT_WORKERS`` threads), awaited
    from the event loop (asyncio's or trio's)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(LONG_TEXT_WORKERS, thread_name_prefix="aioengine-text")
    call = functools.partial(fn, *args, **kwargs)
    if sniffio.current_async_library() != "asyncio":
        from aioengine.client.trio_backend import wait_concurrent
        return await wait_concurrent(_pool.submit(call))
    return await asyncio.get_running_loop().run_in_executor(_pool, call)

# Safe for a lower bound on the token count (see ``Tokenizer.max_token_bytes``): pre-tokenizers
# that split text or map it byte for byte but drop nothing (Whitespace and BertPreTokenizer drop
# spaces, CharDelimiterSplit its delimiter), and normalizers that never shorten text.
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Punctuation", "Split",
                           "Sequence", "UnicodeScripts"}


def _keeps_text(normalizer: Any, pre_tokenizer: Any) -> tuple[bool, bool]:
    """(nothing in the text is deleted or shortened before the model sees it, byte-level)."""
    byte_level = False

    def normalizer_ok(n: Any) -> bool:
        if n is None:
            return True
        kind = n.get("type")
        if kind == "Sequence":
            return all(normalizer_ok(x) for x in n.get("normalizers", []))
        if kind == "Prepend":
            return True
        if kind == "Replace":  # a literal pattern replaced by no fewer bytes
            pattern, content = n.get("pattern", {}), n.get("content", "")
            return (isinstance(pattern, dict) and "String" in pattern
                    and len(content.encode()) >= len(pattern["String"].encode()))
        return False

    def pre_ok(p: Any) -> bool:
        nonlocal byte_level
        if p is None:
            return True
        kind = p.get("type")
        if kind not in _KEEPING_PRE_TOKENIZERS:
            return False
        if kind == "ByteLevel":
            byte_level = True
        if kind == "Sequence":
            return all(pre_ok(x) for x in p.get("pretokenizers", []))
        return str(p.get("behavior", "")).lower() != "removed"  # Split, Punctuation

    return normalizer_ok(normalizer) and pre_ok(pre_tokenizer), byte_level


class Tokenizer:
    """Encode, decode, and render chat for one model directory."""

    def __init__(self, hf: HFTokenizer, config: Mapping[str, Any] | None = None,
                 path: str = "") -> None:
        self.hf = hf
        self.path = path
        config = dict(config or {})
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.bos_token_id = self._id_of(self.bos_token)
        self.eos_token_id = self._id_of(self.eos_token)
        source = pick_template(config.get("chat_template"))
        self.chat_template = (ChatTemplate(source, bos_token=self.bos_token,
                                           eos_token=self.eos_token) if source else None)
        self.vocab_size = hf.get_vocab_size(with_added_tokens=True)
        from tokenizers import decoders

        self._byte_chars = (_byte_level_chars() if isinstance(hf.decoder, decoders.ByteLevel)
                            else None)

    @classmethod
    def from_dir(cls, path: str) -> Tokenizer:
        """Load ``tokenizer.json`` (and ``tokenizer_config.json`` when present) from ``path``."""
        if not os.path.isdir(path):
            raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
        hf = load_hf_tokenizer(path)
        config: dict[str, Any] = {}
        cfg_file = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(cfg_file):
            with open(cfg_file, encoding="utf-8") as f:
                config = json.load(f)
        tmpl_file = os.path.join(path, "chat_template.jinja")
        if "chat_template" not in config and os.path.isfile(tmpl_file):
            with open(tmpl_file, encoding="utf-8") as f:
                config["chat_template"] = f.read()
        return cls(hf, config, path)

    @functools.cached_property
    def max_token_bytes(self) -> int | None:
        """The most bytes of UTF-8 text one token can stand for, when that makes
        ``bytes / max_token_bytes`` a lower bound on a text's token count: a BPE model that
        can spell every byte (byte-level, or byte fallback), a normalizer and pre-tokenizer
        that delete nothing, no added token that swallows the whitespace around it. None
        otherwise (the count is then only known by tokenizing). Computed once."""
        spec = json.loads(self.hf.to_str())
        model = spec.get("model") or {}
        keeps, byte_level = _keeps_text(spec.get("normalizer"), spec.get("pre_tokenizer"))
        if model.get("type") != "BPE" or not keeps \
                or not (byte_level or model.get("byte_fallback")):
            return None
        added = spec.get("added_tokens") or []
        if any(t.get("lstrip") or t.get("rstrip") for t in added):
            return None
        # A byte-level piece spells one byte per character; otherwise count its UTF-8 bytes
        # (more than it stands for: '▁' is 3 bytes for a space, '<0x41>' 6 for one byte).
        vocab = model.get("vocab") or {}
        longest = max((len(p) if byte_level else len(p.encode()) for p in vocab), default=0)
        longest = max([longest, *(len(t.get("content", "").encode()) for t in added)])
        return longest or None

    def min_tokens(self, text: str) -> int:
        """At least this many tokens come from ``text`` (0 when no bound is known): cheap, for
        refusing a text that cannot fit before tokenizing it."""
        most = self.max_token_bytes
        return 0 if most is None else -(-len(text.encode("utf-8", "surrogatepass")) // most)

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.hf.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"prompt text must be a string, got {type(text).__name__}")
        if len(text) > LONG_TEXT_CHARS:
            # tokenizers' encode holds the GIL throughout when the text contains special tokens
            # (every chat prompt does): seconds for a message of a few MB, every other thread of
            # the host stopped (docs/benchmarks.md). encode_batch releases it, gives the same
            # ids, costs the same.
            ids = self.hf.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
            if len(text) > TRIM_AFTER_CHARS:
                release_freed_memory()  # the encoding above is freed by now
            return ids
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_truncated(self, text: str, max_tokens: int | None) -> list[int]:
        """``encode`` with the special tokens, the text cut so that the whole is at most
        ``max_tokens`` (the specials kept: ``[CLS] ... [SEP]``), as transformers truncates."""
        if max_tokens is None:
            return self.encode(text)
        enc = self.hf.encode(text, add_special_tokens=False)
        enc.truncate(max(0, max_tokens - self.hf.num_special_tokens_to_add(False)))
        return self.hf.post_process(enc).ids

    def encode_pair(self, text_1: str, text_2: str,
                    max_tokens: int | None) -> tuple[list[int], list[int]]:
        """A text pair's ids and token type ids with the special tokens (the tokenizer's pair
        template), cut longest-first to ``max_tokens`` as transformers cuts pairs."""
        enc = self._truncating(max_tokens).encode(text_1, text_2)
        return enc.ids, enc.type_ids

    @functools.lru_cache(maxsize=4)  # noqa: B019 (a few lengths, for the tokenizer's life)
    def _truncating(self, max_tokens: int | None) -> HFTokenizer:
        """A copy of the tokenizer that truncates at ``max_tokens`` (the shared one must not:
        its setting would apply to every caller)."""
        from tokenizers import Tokenizer as Fresh

        copy = Fresh.from_str(self.hf.to_str())
        if max_tokens is not None:
            copy.enable_truncation(max_tokens, strategy="longest_first")
        return copy

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for: where its text alone is U+FFFD (it holds part of a
        multi-byte character) the raw bytes from its vocabulary entry, so that the bytes of
        the tokens splitting a character join into it (OpenAI's logprobs ``bytes``)."""
        text = self.hf.decode([token_id], skip_special_tokens=False)
        piece = self.hf.id_to_token(token_id) if REPLACEMENT in text else None
        if piece is None:
            return text.encode()
        byte = _BYTE_TOKEN.fullmatch(piece)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        chars = self._byte_chars
        if chars is not None and all(c in chars for c in piece):
            return bytes(chars[c] for c in piece)
        return text.encode()

    def detokenizer(self, prompt_token_ids: list[int],
                    skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.hf, prompt_token_ids, skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[ChatMessage], *,
                            add_generation_prompt: bool = True, **extra: Any) -> str:
        if self.chat_template is None:
            raise ValueError(f"the tokenizer at {self.path!r} has no chat template "
                             "(no 'chat_template' in tokenizer_config.json)")
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt,
                                         **extra)

    def encode_chat(self, messages: Sequence[ChatMessage], **extra: Any) -> list[int]:
        # The template writes BOS itself when the model wants one, as transformers does.
        return self.encode(self.apply_chat_template(messages, **extra), add_special_tokens=False)
