"""``python -m aioengine.serve --model tiny --port 8000``: see ``aioengine.server.__main__``."""

import sys

from aioengine.server.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
