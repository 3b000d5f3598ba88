"""Hydra plugins of this project (Hydra loads sweepers only from the ``hydra_plugins`` namespace)."""
