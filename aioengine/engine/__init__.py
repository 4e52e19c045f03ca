"""The engine: request state, KV block manager, scheduler, engine core and process, executors.

Importing this package never imports torch; executors load the model lazily.
"""
