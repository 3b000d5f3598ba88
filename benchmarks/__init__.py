"""Measuring the framework: its training loop against a plain PyTorch loop, layouts, techniques.

The scripts in ``scripts/benchmark_*.py`` print tables from these pieces; every rate is a
ratio against a baseline measured in the same process, alternated run by run.
"""
