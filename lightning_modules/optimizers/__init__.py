"""Optimizers: one settings class and one config file (``conf/optimizer/NAME.yaml``) each."""
