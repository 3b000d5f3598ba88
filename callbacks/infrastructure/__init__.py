"""Callbacks of every run: validation schedule, throughput and MFU, optimizer statistics, last checkpoint, progress bar."""
