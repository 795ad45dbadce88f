"""Suite-wide fixtures: service URLs and the shared Redis Cluster."""

from __future__ import annotations

import pytest

from tests import services

_cluster: services.RedisCluster | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _cluster
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        _cluster = services.start_cluster_if_possible()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _cluster is not None:
        _cluster.stop()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the test PostgreSQL database (skip/fail if absent)."""
    return services.need("BOTMESH_TEST_POSTGRES_URL", "PostgreSQL")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the test Redis server (skip/fail if absent)."""
    return services.need("BOTMESH_TEST_REDIS_URL", "Redis")


@pytest.fixture(scope="session")
def redis_cluster_url() -> str:
    """``redis+cluster://`` URL of the three-master test cluster (skip/fail if absent)."""
    return services.need("BOTMESH_TEST_REDIS_CLUSTER_URL", "Redis Cluster")
