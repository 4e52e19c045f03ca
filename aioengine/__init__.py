"""aioengine: an asyncio-native, embeddable LLM inference engine."""

__version__ = "0.1.0"
