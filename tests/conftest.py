"""One pool of 8 live gloo ranks for the whole session (spawning per test is slow)."""

import os

import pytest

os.environ.setdefault("RINGZERO_CHECKS", "1")  # the metadata handshake is on in tests

from ringzero.pool import RankPool  # noqa: E402

POOL_SIZE = 8


@pytest.fixture(scope="session")
def pool():
    p = RankPool(POOL_SIZE, timeout=120.0)
    yield p
    p.close()
