"""The host's tokenizer: the ``tokenizers`` library directly (never transformers, which imports
torch), plus the special tokens and chat template from ``tokenizer_config.json``."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders

from aioengine.client.chat_template import ChatMessage, ChatTemplate, pick_template
from aioengine.text.detokenize import REPLACEMENT, IncrementalDetokenizer, load_hf_tokenizer

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

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.hf.token_to_id(token)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"prompt text must be a string, got {type(text).__name__}")
        if len(text) > LONG_TEXT_CHARS:
            # tokenizers' encode holds the GIL throughout when the text contains special
            # tokens (every chat prompt does): 8.6 s for a 7.8 MB message, every other thread
            # of the host stopped. encode_batch releases it, gives the same ids, costs the same.
            return self.hf.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

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
