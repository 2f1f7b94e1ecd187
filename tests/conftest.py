import pytest
import torch

from support import SEED


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
