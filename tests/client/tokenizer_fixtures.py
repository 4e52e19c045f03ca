"""Small real tokenizers trained in memory for the client's text tests (no network)."""

from __future__ import annotations

import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

MULTILINGUAL = [
    "Once upon a time, there was a little fox who lived in the forest.",
    "Il était une fois un petit renard qui vivait dans la forêt — très âgé.",
    "Érase una vez un zorrito que vivía en el bosque; ¡qué año!",
    "Es war einmal ein kleiner Fuchs, der im Wald lebte. Größe, Übermaß.",
    "Жил-был маленький лис, который жил в лесу.",
    "昔々、森に小さな狐が住んでいました。",
    "从前，有一只小狐狸住在森林里。",  # noqa: RUF001
    "옛날 옛적에 숲 속에 작은 여우가 살았습니다.",
    "كان يا ما كان، ثعلب صغير يعيش في الغابة.",
    "एक समय की बात है, जंगल में एक छोटी लोमड़ी रहती थी।",
    "Emoji: 🦊🌲✨ and flags 🇫🇷🇯🇵, zero-width joiners 👩‍👩‍👧 too.",
]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def byte_level_bpe(vocab_size: int = 400) -> Tokenizer:
    """GPT-2 style byte-level BPE: a small vocabulary, so many characters span tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(MULTILINGUAL * 4, trainer)
    return tok


def metaspace_bpe(vocab_size: int = 300) -> Tokenizer:
    """Sentencepiece-style BPE (leading-space marker, byte fallback)."""
    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = ["<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size + 258, special_tokens=specials)
    tok.train_from_iterator(MULTILINGUAL[:4] * 4, trainer)
    return tok


def write_tokenizer_dir(path: str, tok: Tokenizer, chat_template: str | None = CHAT_TEMPLATE
                        ) -> str:
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}}
    if chat_template is not None:
        config["chat_template"] = chat_template
    with open(os.path.join(path, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)
    return path
