"""Callbacks: the training techniques, one subpackage each, and the infrastructure of every run.

- ``batch_size/``: the adaptive batch size (norm and inner-product tests) and its baselines
  (constant, stagewise warmup, Megatron ramp-up);
- ``seq_len_warmup/``: sequence-length warmup;
- ``diloco/``: DiLoCo outer steps over real or simulated replicas, streaming fragments;
- ``infrastructure/``: validation schedule, throughput and MFU, optimizer statistics,
  checkpoints at the end, the token progress bar.

Techniques and infrastructure talk to the training module only through the training state
(``lightning_modules/training_state.py``) and the step hooks of
``lightning_modules/step_callback.py``; a technique's settings class (``technique.py``) is
checked before anything runs.
"""
