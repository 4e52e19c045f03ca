"""Encoder models (BERT) for embedding requests: a bidirectional forward over whole inputs, no
KV cache, and the pooling that turns its hidden states into one vector per input."""
