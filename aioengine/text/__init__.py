"""Text work shared by the host and the engine process, torch-free: the incremental
detokenizer (below ``client`` and ``engine``; it imports only ``messages`` and tokenizers)."""
