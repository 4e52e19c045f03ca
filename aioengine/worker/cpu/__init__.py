"""The CPU side of the worker: the compiled kernels (``kernels``) and what runs them: the CPU
backend that picks a loaded model's decode path (``backend``), the per-layer loop of compiled
ops (``layer_path``) and the decode plan and lane (``decode_plan``)."""
