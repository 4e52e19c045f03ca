"""The Anthropic Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``): a
typed translation at the edge into the chat route's conversation model and back."""
