# ruff: noqa: RUF001 - the corpus is deliberately multilingual
"""A small built-in corpus of mixed text: trains the tiny model's tokenizer and gives its
weights a bigram structure. Fixed text, so everything built from it is deterministic."""

from __future__ import annotations

DOCUMENTS: tuple[str, ...] = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman and his "
    "wife. Every morning he went out in his boat, and every evening he came back with a few "
    "fish. One day he caught a golden fish that could speak. \"Let me go,\" said the fish, "
    "\"and I will give you whatever you wish.\" The old man was kind, so he let it go and "
    "asked for nothing at all.",
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a "
    "single step. All that glitters is not gold. Actions speak louder than words. The early "
    "bird catches the worm, but the second mouse gets the cheese.",
    "It was a bright cold day in April, and the clocks were striking thirteen. The rain fell "
    "softly on the roofs of the city while people hurried home from work. In the park, a "
    "child was feeding the birds, and an old woman was reading a book on a bench.",
    "Machine learning is the study of computer algorithms that improve automatically through "
    "experience. A language model assigns a probability to a sequence of words. Given the "
    "words so far, it predicts the next word, one token at a time. Large models are trained "
    "on a great deal of text and can answer questions, write stories, and translate between "
    "languages.",
    "An inference engine runs a trained model to produce outputs. It batches many requests "
    "together, keeps the attention keys and values of each sequence in a paged cache, and "
    "schedules prefill and decode steps so that the processor stays busy. Throughput is the "
    "number of tokens generated per second; latency is the time until the first token.",
    "Question: What is the capital of France?\nAnswer: The capital of France is Paris.\n"
    "Question: How many days are there in a week?\nAnswer: There are seven days in a week.\n"
    "Question: What color is the sky on a clear day?\nAnswer: The sky is blue.",
    "User: Hello! Can you help me write a short poem about the moon?\nAssistant: Of course. "
    "Here is a short poem:\nThe silver moon climbs high tonight,\nit fills the sleeping "
    "fields with light,\nand every star that shines so bright\nkeeps watch until the morning "
    "light.",
    "def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
    "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
    "if __name__ == \"__main__\":\n    print([fibonacci(i) for i in range(10)])\n",
    "import asyncio\n\n\nasync def main() -> None:\n    queue: asyncio.Queue[str] = "
    "asyncio.Queue()\n    await queue.put(\"hello\")\n    item = await queue.get()\n"
    "    print(item.upper())\n\n\nasyncio.run(main())\n",
    "for (let i = 0; i < items.length; i++) {\n  const item = items[i];\n  if (item.done) {\n"
    "    continue;\n  }\n  console.log(`item ${i}: ${item.name}`);\n}\n",
    "{\"id\": 42, \"name\": \"example\", \"tags\": [\"alpha\", \"beta\"], \"active\": true, "
    "\"score\": 3.14159, \"created\": \"2024-05-01T12:00:00Z\"}",
    "SELECT name, COUNT(*) AS total FROM orders WHERE status = 'shipped' GROUP BY name "
    "ORDER BY total DESC LIMIT 10;",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20. 100, 200, 300, 1000, 2048, 4096, "
    "65536. 3.14, 2.718, 1.414, 0.5, -1, +42, 1e-5, 7/8, 50%. Call 555-0100 at 9:30 am.",
    "# Release notes\n\n- Faster decoding with batched attention.\n- Fixed a crash when the "
    "prompt was empty.\n- Added support for streaming outputs over HTTP.\n\n## Upgrading\n\n"
    "Run `pip install --upgrade` and restart the server.",
    "Il était une fois une petite fille qui vivait au bord de la forêt. Elle aimait les "
    "fleurs, les oiseaux et les longues promenades. « Bonjour ! » dit-elle au vieux loup.",
    "Es war einmal ein König, der hatte drei Töchter. Die jüngste war so schön, dass die "
    "Sonne selbst sich wunderte. Straße, Größe, Mädchen, Übung, schön, grün.",
    "Había una vez un pequeño pueblo en las montañas. ¿Dónde está la biblioteca? ¡Qué día "
    "tan bonito! El niño comió una manzana y bebió agua fría.",
    "Жили-были старик со старухой у самого синего моря. Привет, как дела? Спасибо, хорошо.",
    "从前有一座山，山上有一座庙。今天天气很好，我们去公园散步吧。你好，世界！",
    "むかしむかし、あるところにおじいさんとおばあさんが住んでいました。こんにちは、元気ですか。",
    "안녕하세요. 오늘은 날씨가 좋습니다. 감사합니다!",
    "Emoji and symbols: 🙂 🚀 ✨ ❤️ 👍 — ‘quotes’ “double” … © ® ™ € £ ¥ ± × ÷ → ← ≤ ≥ ∞ √ π.",
    "The model reads the prompt, and then it writes the answer. The answer is short. The "
    "story is long. The cat sat on the mat, and the dog slept by the door. The sun rose over "
    "the hills and the day began. We walked to the river and watched the boats go by.",
    "Dear team,\n\nThank you for your hard work this month. The new release is ready, and "
    "the tests pass on every platform. Please review the changes before Friday.\n\nBest "
    "regards,\nAlex",
    "To make tea, boil fresh water, warm the pot, add one spoon of tea for each cup, pour the "
    "water, and wait three to five minutes. Add milk or lemon if you like.",
    "The history of science is the story of people asking questions about the world: why the "
    "stars move, what things are made of, how living things grow. Each answer leads to new "
    "questions, and the search goes on.",
)
