"""The tiny model's tokenizer: byte-level BPE trained on the built-in corpus (round-trips any
UTF-8 text), special tokens, and a ChatML-style chat template."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from aioengine.hub.corpus import DOCUMENTS

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BOS, EOS, PAD, IM_START, IM_END = "<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, IM_START, IM_END]  # ids 0..4, in this order
TARGET_VOCAB = 2048
MAX_LENGTH = 2048

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer() -> Tokenizer:
    # imported here: every engine imports this module (through aioengine.hub), and only the
    # first use of the tiny model trains a tokenizer
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TARGET_VOCAB, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, min_frequency=1)
    tok.train_from_iterator(list(DOCUMENTS), trainer=trainer)
    # Like Llama tokenizers: encode() prepends <|bos|>; the chat template writes it itself.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, 0)])
    return tok


def write_tokenizer(tok: Tokenizer, out_dir: str) -> None:
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}, f, indent=2)
