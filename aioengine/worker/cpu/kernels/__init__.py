"""All of the worker's C code, and the one place that builds, caches and loads it.

Four libraries, each a folder of C sources and headers compiled by one compiler call with the
flags its numerics need (``library.LIBRARIES``): ``quant/`` the quantized and float32 matrix
products (a traits table per tensor type, ``quant/traits.h``), ``ops/`` a decoder layer's
element-wise work, ``plan/`` the decode plan that runs a step's layers in one call,
``attention/`` paged decode attention. ``library.load`` builds a library once per machine into
the aioengine cache (keyed by a hash of its sources, headers, flags, compiler and CPU) and
returns it with every function's ctypes signature set.
"""
