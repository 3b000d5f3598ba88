"""Make the repository root importable and keep Hugging Face libraries offline in tests."""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

# The models in tests are tiny: one thread is as fast and leaves the other core free.
torch.set_num_threads(1)
