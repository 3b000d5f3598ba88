"""What an external launcher tells each process it starts: torchrun (torchelastic) or SLURM's srun.

Lightning starts the processes of a one-node run itself; across nodes a launcher starts them,
one agent per node, and hands each process its rank and the world's size in environment
variables, which Lightning reads (``TorchElasticEnvironment``, ``SLURMEnvironment``). Reading
the same variables here lets a run refuse a config that disagrees with them as it starts,
before any process waits at a rendezvous for peers that will never come.
"""

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: torchrun's run id when ``--rdzv-id`` is not given: shared by every run, so it names none.
NO_RUN_ID = "none"


@dataclass(frozen=True)
class ExternalLaunch:
    """The launcher's view of the run: how many processes in all and on this node, and the id
    every process of this run shares (None where the launcher gives none)."""

    launcher: str  # "torchrun" or "srun"
    world_size: int
    local_world_size: int | None
    run_id: str | None


def external_launch(env: Mapping[str, str] = os.environ) -> ExternalLaunch | None:
    """The launcher that started this process, as Lightning detects it; None for a process
    started by hand or by Lightning itself (its own child processes carry neither set)."""
    if all(key in env for key in ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")):
        run_id = env.get("TORCHELASTIC_RUN_ID")
        return ExternalLaunch(
            "torchrun",
            int(env["WORLD_SIZE"]),
            int(env["LOCAL_WORLD_SIZE"]),
            None if run_id in (None, "", NO_RUN_ID) else run_id,
        )
    if "SLURM_NTASKS" in env and "SLURM_PROCID" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        job = env.get("SLURM_ARRAY_JOB_ID") and f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID')}"
        return ExternalLaunch(
            "srun",
            int(env["SLURM_NTASKS"]),
            _tasks_on_this_node(env.get("SLURM_TASKS_PER_NODE")),
            job or env.get("SLURM_JOB_ID"),
        )
    return None


def _tasks_on_this_node(tasks_per_node: str | None) -> int | None:
    """SLURM's ``SLURM_TASKS_PER_NODE`` (``4(x2)``, or ``4,3`` for uneven nodes) when every node
    runs the same number of tasks, else None."""
    counts = {int(count) for count in re.findall(r"(\d+)(?:\(x\d+\))?", tasks_per_node or "")}
    return counts.pop() if len(counts) == 1 else None
