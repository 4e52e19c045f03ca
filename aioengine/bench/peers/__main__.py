"""``python -m aioengine.bench.peers SPEC``: one measurement of our engine (``child.measure``),
printed as one ``PEERS-RESULTS {json}`` line for the suite's process."""

import json
import sys

from aioengine.bench.peers.child import MARK, measure

if __name__ == "__main__":
    print(MARK + json.dumps(measure(json.loads(sys.argv[1]))), flush=True)
