"""The client layer (host side): ``AsyncMPClient``, ``SyncMPClient``, ``LLM``, the in-process
client, tokenization, incremental detokenization and per-request output state.

Importing it never imports torch: the engine runs in spawned child processes.
"""
