"""ChildSpec.env: variables a child starts with (glibc reads GLIBC_TUNABLES before Python runs),
set for the spawn only; the model processes get the huge-page heap tunable by default."""

from __future__ import annotations

import os
import threading
from multiprocessing import resource_tracker

import pytest

from aioengine.runtime import ChildSpec, Supervisor
from aioengine.runtime.heap_env import OMP_WAIT_ENV, model_process_env
from tests.runtime.targets import encode_args

pytestmark = pytest.mark.timeout(90)


def test_the_child_starts_with_env_and_the_parent_keeps_its_own(monkeypatch) -> None:
    monkeypatch.setenv("AIOENGINE_TEST_KEPT", "parent")
    monkeypatch.delenv("AIOENGINE_TEST_NEW", raising=False)
    sup = Supervisor()
    try:
        names = ["AIOENGINE_TEST_KEPT", "AIOENGINE_TEST_NEW", "GLIBC_TUNABLES"]
        ready = sup.start([ChildSpec(
            "aioengine-test-env", "tests.runtime.targets:idle", encode_args(env_names=names),
            env={"AIOENGINE_TEST_KEPT": "child", "AIOENGINE_TEST_NEW": "1",
                 "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"})], 60)
        child = ready["aioengine-test-env"]["env"]  # the child's process title hides /proc environ
        assert child["AIOENGINE_TEST_KEPT"] == "child" and child["AIOENGINE_TEST_NEW"] == "1"
        assert child["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    finally:
        sup.shutdown()
    assert os.environ["AIOENGINE_TEST_KEPT"] == "parent"
    assert "AIOENGINE_TEST_NEW" not in os.environ


def test_children_start_while_another_thread_rewrites_the_environment() -> None:
    """A host thread that sets variables (numpy's import does) while we exec must not hand the
    child a freed ``environ``: with multiprocessing's own spawn about a third of these children
    died before READY with exit code 255."""
    resource_tracker.ensure_running()  # the stdlib starts its tracker with the shared environ
    stop = threading.Event()

    def churn() -> None:  # growing and shrinking the environment reallocates glibc's array
        while not stop.is_set():
            for j in range(40):
                os.environ[f"AIOENGINE_TEST_CHURN_{j}"] = "x" * (10 + j)
            for j in range(40):
                del os.environ[f"AIOENGINE_TEST_CHURN_{j}"]

    churner = threading.Thread(target=churn, daemon=True)
    churner.start()
    sup = Supervisor()
    try:
        names = [f"aioengine-test-churn-{i}" for i in range(16)]
        ready = sup.start([ChildSpec(name, "tests.runtime.targets:idle",
                                     encode_args(env_names=["AIOENGINE_TEST_SET"]),
                                     env={"AIOENGINE_TEST_SET": name}) for name in names], 120)
        assert {name: ready[name]["env"]["AIOENGINE_TEST_SET"] for name in names} == {
            name: name for name in names}
    finally:
        stop.set()
        churner.join()
        sup.shutdown()


@pytest.mark.parametrize("env", [{"": "x"}, {"A=B": "x"}, {"A": 1}])
def test_bad_env_is_refused_by_name(env) -> None:
    with pytest.raises(ValueError, match="env of child 'c' must map names to str values"):
        ChildSpec("c", "tests.runtime.targets:idle", env=env)


def test_model_process_env(monkeypatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv(OMP_WAIT_ENV, raising=False)
    passive = {OMP_WAIT_ENV: "PASSIVE"}
    assert model_process_env() == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", **passive}
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    assert model_process_env() == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1", **passive}
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")  # the user's choice stands
    assert model_process_env() == passive
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert model_process_env(huge_pages=False) == passive  # CpuKernelConfig.huge_pages off
    monkeypatch.setenv(OMP_WAIT_ENV, "ACTIVE")  # the user's policy stands
    assert model_process_env(huge_pages=False) == {}
