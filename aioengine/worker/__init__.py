"""Worker layer: model runner, models, paged attention, KV cache, loader, sampler.

Kept light on purpose: importing ``aioengine.worker`` pulls in nothing heavy; import the
submodules (``aioengine.worker.models``, ``aioengine.worker.loader``, ...) where torch is wanted.
"""
