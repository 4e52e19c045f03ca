"""A two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, one CPU per node), shared
by the package's tests: starting one costs ~13 s on the 2-core box. Its processes belong to this
package-scoped fixture (the leak checks leave them alone until it ends)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need ray: pip install 'aioengine[ray]'")


SERVE_PROXY_WAITS = {
    # Serve's controller gives a new proxy actor 5 s to answer its ready check, then kills and
    # restarts it (5 s more per restart); on a loaded 2-core machine the proxy's worker process
    # alone takes longer to start, so every try died "before it started running". The
    # controller reads these when it starts, from the cluster's environment, set here.
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "120",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
}


@pytest.fixture(scope="package")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as env:
        for name, value in SERVE_PROXY_WAITS.items():
            env.setenv(name, value)
        # No fixed dashboard ports: another test run (an xdist worker's cluster) may hold
        # 8265/52365, and a head without its dashboard fails the state API the tests check
        # leftovers with.
        c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "dashboard_port": None, "dashboard_agent_listen_port": None})
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        ray.init(address=c.address, logging_level="warning", log_to_driver=False)
        try:
            yield c
        finally:
            ray.shutdown()
            c.shutdown()
