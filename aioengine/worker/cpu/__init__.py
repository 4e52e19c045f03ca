"""The CPU side of the worker: the compiled kernels (``kernels``) and what runs them."""
