"""Keep Hugging Face libraries offline in tests (pyproject's `pythonpath` makes the repository importable)."""

import os

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

# The models in tests are tiny: one thread is as fast and leaves the other core free.
torch.set_num_threads(1)
