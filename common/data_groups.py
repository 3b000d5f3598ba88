"""Data groups: jobs that train one global batch together, each on its own slice.

torchft DiLoCo runs each replica group as a job of its own; to one job the other groups'
ranks count as data-parallel ranks it never talks to: the global batch and the data stream
are split over all of them (``lightning_modules/global_batch.py``, ``data/sampler.py``).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class DataGroups:
    """This job's place among the jobs that share one global batch and data stream: group
    ``index`` of ``count`` (1 and 0 for an ordinary job)."""

    count: int = 1
    index: int = 0

    def data_parallel_size(self, world_size: int) -> int:
        """Ranks the global batch and the data stream are split over, in every group."""
        return world_size * self.count

    def data_parallel_rank(self, global_rank: int, world_size: int) -> int:
        return self.index * world_size + global_rank
