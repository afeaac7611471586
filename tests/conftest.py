"""Suite-wide test settings: tests marked ``gpu`` skip without a CUDA device; the tiny models run single-threaded."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    """The tiny test models run thousands of small ops; on CI's 2 cores torch's thread pool makes them
    several times slower, so the suite runs single-threaded (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
