"""A console that shows only what helps: each log line once, no messages that say nothing to a user.

Lightning logs through its own handler and through the root logger Hydra configures, so
every line appeared twice; its messages then go through Hydra's handlers only (console
and the run's ``train.log``). Messages and warnings that are advice to Lightning users in
general, not about this run, are dropped by their exact text, at their source.
"""

import logging
import warnings

# Logged by libraries on every run, and true of every run: nothing for a user to act on.
SILENCED_MESSAGES = (
    "try installing [litlogger]",  # Lightning's advertisement for its cloud logger
    "`weights_only` was not set, defaulting to `False`",  # our own checkpoints hold config objects
)
SILENCED_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # inside Lightning, not ours to change
    r"Detected an existing checkpoint in .*, overwriting",  # last.ckpt is meant to be overwritten
    # ModelCheckpoint saves the state after the optimizer step: the state the clock describes.
    r"Using ModelCheckpoint with manual optimization",
    # The data loaders are deliberate (data/batches.py): batches are memmap slices, so no
    # workers; a length, so Lightning does not prefetch past the resumable position; a
    # resume mid-epoch is exact because the position is restored by the data module.
    r".*does not have many workers",
    r"Your `IterableDataset` has `__len__` defined",
    r"You're resuming from a checkpoint that ended before the epoch ended",
)
LIBRARY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")


class DropMessages(logging.Filter):
    """Drops records whose message contains one of the silenced texts."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in SILENCED_MESSAGES)


def quiet_console() -> None:
    """Route Lightning's log lines through the root handlers only, and drop the silenced ones there."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for handler in [h for h in logger.handlers if isinstance(h, logging.StreamHandler)]:
            logger.removeHandler(handler)
        logger.propagate = True
    drop = DropMessages()
    for handler in logging.getLogger().handlers:
        handler.addFilter(drop)
    for pattern in SILENCED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
