"""Pieces every layer shares and that depend on nothing of the project: the user-error types."""
