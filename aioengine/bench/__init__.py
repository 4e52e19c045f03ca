"""``python -m aioengine.bench``: benchmarks of aioengine and its transports.

An app on top of the library (it prints tables; the library never does). Each suite is a
module with ``run(options) -> list[Result]``, listed in ``suites.SUITES``.
"""
