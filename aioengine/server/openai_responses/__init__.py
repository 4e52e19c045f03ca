"""The OpenAI Responses API (``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}``): a
typed translation at the edge into the chat route's conversation model and back, with a bounded
store for ``previous_response_id``."""
