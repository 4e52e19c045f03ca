"""aioengine on Ray Serve: two Serve replicas, each with its own engine, behind Ray Serve's
prefix-aware router. Questions that share a long system prompt land on the replica that has it
cached (``num_cached_tokens`` > 0 from the second one on).

    pip install 'aioengine[ray]'
    python examples/ray_serve_app.py                  # starts a local Ray instance
    python examples/ray_serve_app.py --address auto   # or joins a running cluster
"""

from __future__ import annotations

import argparse

import ray
from ray import serve

from aioengine import EngineConfig
from aioengine.integrations.ray_serve import CompletionRequest, deployment

SYSTEM = "You are a terse assistant who answers in one short sentence. " * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=None, help="a Ray cluster to join (default: start "
                        "a local one)")
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    if args.address:
        ray.init(address=args.address, logging_level="warning", log_to_driver=False)
    else:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning",
                 log_to_driver=False)
    try:
        app = deployment(EngineConfig(model=args.model), num_replicas=2,
                         ray_actor_options={"num_cpus": 0.5}, health_check_period_s=2)
        handle = serve.run(app, name="aioengine", route_prefix=None)
        params = {"max_tokens": 16, "temperature": 0.0}
        for question in ("What is Ray?", "What is Serve?", "What is a replica?"):
            reply = handle.completions.remote(CompletionRequest(SYSTEM + question, params))
            out = reply.result(timeout_s=300)
            print(f"{question!r}: {out['text']!r} (cached prompt tokens: "
                  f"{out['num_cached_tokens']})")
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
