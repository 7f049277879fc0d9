import os

import pytest
from hypothesis import HealthCheck, settings
from stops import default_stop_signals

# The same tests whether the suite was started from a terminal or in the background.
default_stop_signals()

settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=60, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test. Tiny ops: a second thread only adds
    contention (30x slower on a busy 2-core machine); one thread also makes the run
    reproducible."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
