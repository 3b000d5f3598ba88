"""One run folder for every process of a run that an external launcher started.

A run's folder is named for the second it started (``conf/train.yaml``: ``hydra.run.dir``).
Lightning's own child processes are handed their parent's folder; processes that torchrun or
srun start on several nodes each name their own, a second apart or on another node's clock,
and a sharded checkpoint would be split between folders. So under such a launcher the folder
is named for the run id every process shares (torchrun's ``--rdzv-id``, SLURM's job id), or
the user names it; a launch with neither is refused before any process waits for the others.
"""

from common.errors import UserError
from common.external_launch import external_launch

RUN_DIR = "hydra.run.dir"


def shared_run_folder(arguments: list[str]) -> list[str]:
    """The override that gives every process of an externally launched run one folder: none
    for a run Lightning starts, a multirun or a folder the command names already."""
    launched = external_launch()
    if launched is None or launched.world_size == 1 or "-m" in arguments or "--multirun" in arguments:
        return []
    if any(argument.startswith(f"{RUN_DIR}=") for argument in arguments):
        return []
    if launched.run_id is None:
        raise UserError(
            f"{launched.launcher} started {launched.world_size} processes without a run id, so each would name its"
            f" own run folder: pass torchrun --rdzv-id=NAME (a new one per run), or {RUN_DIR}=FOLDER on a path"
            " every node sees."
        )
    return [f"{RUN_DIR}=${{paths.output_dir}}/runs/${{experiment_name}}/{launched.launcher}-{launched.run_id}"]
