"""The adaptive batch size (Lau, Liu, Kolar 2024) and its baselines: constant, stagewise warmup, linear ramp-up."""
