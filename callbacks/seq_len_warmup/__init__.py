"""Sequence-length warmup (Li, Zhang, He 2022): short sequences first, the packed length later."""
