"""A distributed run that lost a peer mid-run: told apart from a bug, ended in one line per node.

A collective fails when another process of the run is gone: gloo notices a killed peer at once
(its connection closes) and a frozen or unreachable one when the process group's timeout
(``collective_timeout_s``) runs out; NCCL's watchdog raises a ``DistBackendError`` at that
timeout. Either way the process has nothing left to train with, and its traceback (and the
launcher's report after it) would bury what happened: which rank noticed, at which step, and
where the run resumes from.
"""

import os

import torch.distributed as dist

#: What gloo says (lower-cased) when a peer's connection closed (killed, crashed) or did not
#: answer in time ("Timed out waiting ... for recv", "Application timeout caused pair closure").
CLOSED = ("connection closed by peer", "connection reset by peer", "broken pipe")
TIMED_OUT = ("timed out", "timeout")


def is_lost_peer(error: BaseException) -> bool:
    """Whether a collective failed because a peer is gone, as opposed to a bug in this process."""
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and any(sign in str(error).lower() for sign in CLOSED + TIMED_OUT)


def lost_peer_message(error: BaseException, step: int, checkpoint: str, timeout_s: float) -> str:
    """The line a process that is left prints: who noticed, why, and how the run continues."""
    rank, world = os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE", "?")
    node = os.environ.get("GROUP_RANK", os.environ.get("SLURM_NODEID", os.environ.get("NODE_RANK", "0")))
    if any(sign in str(error).lower() for sign in CLOSED):
        why = "a peer process closed its connection (killed, crashed, or its node went down)"
    else:
        why = f"a peer did not answer within collective_timeout_s={timeout_s:g} (frozen, unreachable, or that slow)"
    resume = (
        f"resume with ckpt_path={checkpoint} once every node is back"
        if checkpoint
        else "no checkpoint was written yet: start the run again once every node is back"
    )
    return f"rank {rank} of {world} (node {node}) lost a peer at step {step}: {why}; {resume}."
