"""Suite-wide settings: float64 models on small problems run fastest single-threaded."""

import torch

torch.set_num_threads(1)
