import os
import random

import pytest
import torch

# Fresh inputs every run; the seed is printed so a failure can be replayed
# with MPGEMM_TEST_SEED=<seed>.
SEED = int(os.environ.get("MPGEMM_TEST_SEED", random.SystemRandom().randrange(2**31)))


def pytest_report_header(config):
    return f"mpgemm test seed: {SEED} (replay with MPGEMM_TEST_SEED={SEED})"


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(SEED)


def pytest_collection_modifyitems(config, items):
    """`gpu` marks a test that needs a CUDA GPU: the ones marked by hand and
    every test parametrized with device "cuda". `pytest -m gpu` runs just
    them (the GPU check does); without a GPU they are skipped."""
    has_gpu = torch.cuda.is_available()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec and "cuda" in map(str, callspec.params.values()):
            item.add_marker(pytest.mark.gpu)
        if not has_gpu and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="needs a GPU"))


def require_nvcc():
    """True when the nvcc-based checks must run rather than skip (CI sets it)."""
    return os.environ.get("MPGEMM_REQUIRE_NVCC") == "1"


def skip_or_fail(reason):
    if require_nvcc():
        pytest.fail(f"{reason} (MPGEMM_REQUIRE_NVCC=1 makes this a failure)")
    pytest.skip(reason)
