"""The settings jobs that train one model together must share: the resolved run config, flat.

Fault-tolerant DiLoCo runs each replica group as a job of its own, started with its own
command; a group started with another seed, learning rate or corpus would train a different
model and average it in silently. The groups therefore compare what every one of them
trains with: each key of the resolved config (``model.d_model``, ``optimizer.lr``, ``seed``,
...) with its value, less the keys that differ between groups by design (which group it is,
where it writes, the lighthouse it asks, how it logs) and plus the tokens' own fingerprint,
which the data module adds (``data.tokens``, a digest of the token ids): the same path can
hold other files, and identical copies of a corpus sit at other paths on other hosts, so
the data's locations (``DATA_LOCATIONS``) are not compared, their content is. Settings left
at ``auto`` are compared as each job resolves them (the DiLoCo callback adds them).
A run may name more per-job keys in ``technique.diloco.torchft.per_group_keys`` (e.g. a
callback of its own that writes to each group's folder); they must not change training.
"""

from typing import Any

from omegaconf import DictConfig, OmegaConf

#: Keys (and the subtrees under them) that may differ between the jobs of one run.
PER_JOB = (
    "technique.diloco.torchft.group",
    "technique.diloco.torchft.lighthouse",
    "technique.diloco.torchft.host",
    "paths",
    "data.cache_dir",
    "trainer.default_root_dir",
    "callbacks.model_checkpoint.dirpath",
    "callbacks.progress_bar",
    "logger",
    "experiment_name",
    "experiment_note",
    "ckpt_path",
    "hydra",
)
#: Where a run names keys of its own that may differ between its jobs.
MORE_PER_JOB = "technique.diloco.torchft.per_group_keys"
#: Where the data are, which may differ between hosts: the jobs compare the tokens' content
#: instead (``data/content_digest.py``). Key suffixes under ``data.`` (a mixture's sources too).
DATA_LOCATIONS = (".source.paths", ".source.val_paths", "data.tokenizer.path")


def shared_settings(cfg: DictConfig) -> tuple[tuple[str, str], ...]:
    """Every leaf of ``cfg`` but the per-job ones, as (dotted key, value's repr), sorted; a
    value that cannot be resolved here (a Hydra runtime path outside a run) as written."""
    per_job = (*PER_JOB, *(OmegaConf.select(cfg, MORE_PER_JOB, default=None) or ()))
    leaves: dict[str, str] = {}
    _flatten(cfg, "", leaves, per_job)
    return tuple(sorted(leaves.items()))


def _per_job(key: str, per_job: tuple[str, ...]) -> bool:
    located = key.startswith("data.") and key.endswith(DATA_LOCATIONS)
    return located or any(key == prefix or key.startswith(f"{prefix}.") for prefix in per_job)


def _flatten(node: Any, prefix: str, leaves: dict[str, str], per_job: tuple[str, ...]) -> None:
    if isinstance(node, DictConfig):
        for key in node.keys():
            path = f"{prefix}{key}"
            if _per_job(path, per_job):
                continue
            try:
                child = node[key]
            except Exception:  # an interpolation only Hydra's runtime resolves
                child = OmegaConf.to_container(node, resolve=False)[key]
            _flatten(child, f"{path}.", leaves, per_job)
        return
    value = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
    leaves[prefix.rstrip(".")] = repr(value)
