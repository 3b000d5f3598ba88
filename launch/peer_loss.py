"""A distributed run that lost a peer mid-run: told apart from a bug, ended in one line per node.

A collective fails when another process of the run is gone: gloo notices a killed peer at once
(its connection closes) and a frozen or unreachable one when the process group's timeout
(``collective_timeout_s``) runs out; NCCL's watchdog raises a ``DistBackendError`` at that
timeout. Either way the process has nothing left to train with, and its traceback (and the
launcher's report after it) would bury what happened: which rank noticed, at which step, and
where the run resumes from.
"""

import lightning as L
import torch.distributed as dist

#: What gloo's collectives say when a peer's connection closed (killed, crashed) ...
CLOSED = ("Connection closed by peer", "Connection reset by peer")
#: ... or when it did not answer within the process group's timeout.
TIMED_OUT = ("Timed out waiting", "Application timeout caused pair closure")


def is_lost_peer(error: BaseException, trainer: L.Trainer) -> bool:
    """Whether a collective of a distributed run failed because a peer is gone, as opposed to
    a bug in this process (whose traceback is kept)."""
    if trainer.world_size == 1:
        return False
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and any(sign in str(error) for sign in CLOSED + TIMED_OUT)


def lost_peer_message(error: BaseException, trainer: L.Trainer, step: int, timeout_s: float) -> str:
    """The line a process that is left prints: who noticed, why, and how the run continues."""
    if any(sign in str(error) for sign in CLOSED):
        why = "a peer process closed its connection (killed, crashed, or its node went down)"
    else:
        why = f"a peer did not answer within collective_timeout_s={timeout_s:g} (frozen, unreachable, or that slow)"
    checkpoint = getattr(trainer.checkpoint_callback, "last_model_path", "")
    resume = (
        f"resume with ckpt_path={checkpoint} once every node is back"
        if checkpoint
        else "no checkpoint was written yet: start the run again once every node is back"
    )
    where = f"rank {trainer.global_rank} of {trainer.world_size} (node {trainer.node_rank})"
    return f"{where} lost a peer at step {step}: {why}; {resume}."
