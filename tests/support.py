"""What the tests share besides fixtures: the repository's root, the run's
random seed, and the rule for checks that need nvcc (a skip, or under
MPGEMM_REQUIRE_NVCC=1, as CI sets, a failure)."""

import os
import random

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Fresh inputs every run; the seed is printed so a failure can be replayed
# with MPGEMM_TEST_SEED=<seed>.
SEED = int(os.environ.get("MPGEMM_TEST_SEED", random.SystemRandom().randrange(2**31)))


def require_nvcc():
    """True when the nvcc-based checks must run rather than skip (CI sets it)."""
    return os.environ.get("MPGEMM_REQUIRE_NVCC") == "1"


def skip_or_fail(reason):
    if require_nvcc():
        pytest.fail(f"{reason} (MPGEMM_REQUIRE_NVCC=1 makes this a failure)")
    pytest.skip(reason)


def set_environment(monkeypatch, name, value):
    """`name` set to `value` for the test, or unset where value is None (its
    default)."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
