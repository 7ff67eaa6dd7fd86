"""Suite-wide settings: float64 models on small problems run fastest single-threaded, and every
test starts from the same global random state, so a result never depends on which tests ran
before it."""

import random

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _same_global_random_state():
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
