"""A two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``, one CPU per node), shared
by the package's tests: starting one costs ~13 s on the 2-core box. Its processes belong to this
package-scoped fixture (the leak checks leave them alone until it ends)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need ray: pip install 'aioengine[ray]'")


@pytest.fixture(scope="package")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="warning", log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
