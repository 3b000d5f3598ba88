"""Data groups: jobs that train one global batch together, each on its own slice.

torchft DiLoCo runs each replica group as a job of its own; to one job the other groups'
ranks count as data-parallel ranks it never talks to: the global batch and the data stream
are split over all of them (``lightning_modules/global_batch.py``, ``data/sampler.py``).
Within a job, the ranks a model replica is split over (tensor parallelism) read the same
data: ``model_parallel`` consecutive ranks are one data-parallel rank.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class DataGroups:
    """This job's place among the jobs that share one global batch and data stream: group
    ``index`` of ``count`` (1 and 0 for an ordinary job)."""

    count: int = 1
    index: int = 0
    #: Consecutive ranks of this job that hold one model replica together (and read the same data).
    model_parallel: int = 1

    def data_parallel_size(self, world_size: int) -> int:
        """Ranks the global batch and the data stream are split over, in every group."""
        return self.job_data_parallel_size(world_size) * self.count

    def job_data_parallel_size(self, world_size: int) -> int:
        """This job's data-parallel ranks."""
        return world_size // self.model_parallel

    def data_parallel_rank(self, global_rank: int, world_size: int) -> int:
        return self.index * self.job_data_parallel_size(world_size) + global_rank // self.model_parallel
