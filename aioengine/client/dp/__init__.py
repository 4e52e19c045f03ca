"""Data parallelism in the client: engine replicas behind one ``AsyncMPClient``."""
