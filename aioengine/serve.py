"""``python -m aioengine.serve --model tiny --port 8000``: see ``aioengine.server.__main__``.

This module imports nothing heavy before it makes Ctrl-C end the program with one line and
status 130: the server's imports (aiohttp, jinja2, ...) take a good part of a second.
"""

import sys

from aioengine.program_interrupt import exit_at_once_on_sigint


def run() -> int:
    """The program (also the ``aioengine-serve`` console script)."""
    exit_at_once_on_sigint("aioengine.serve")
    from aioengine.server.__main__ import main

    return main()


if __name__ == "__main__":
    sys.exit(run())
