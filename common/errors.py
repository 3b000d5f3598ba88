"""User mistakes, told apart from bugs.

A mistake in settings, data or a checkpoint raises a ``UserError`` whose message names
the setting or file and says how to fix it. ``train.py`` (and the scripts) print it as
one ``error:`` line on rank 0 and exit with code 2; any other exception is a bug in the
code and keeps its traceback. A job that trained to its end on weights that are not its
run's (``StaleWeights``) is no mistake of the user's but has no result to use: one line too,
exit code 3. A distributed run whose peer was lost mid-run (a node killed, a process frozen
past ``collective_timeout_s``) is neither: every node that is left says so in one line and
exits with code 4 (``PeerLost``); the run resumes from its last checkpoint once the nodes are back.
"""

#: The exit code of a job that ended on weights that are not its run's.
STALE_WEIGHTS_EXIT = 3
#: The exit code of a process whose peer was lost mid-run.
PEER_LOST_EXIT = 4


class UserError(Exception):
    """A mistake the user can fix; the message names what is wrong and the fix."""


class ConfigError(UserError, ValueError):
    """A setting that cannot work."""


class DataError(UserError, ValueError):
    """A corpus, file or tokenizer that cannot be used as configured."""


class CheckpointError(UserError, ValueError):
    """A checkpoint that is missing, unreadable or does not fit the configured run."""


class StaleWeights(Exception):
    """A job that trained to its end on weights that are not its run's final weights (a
    fault-tolerant DiLoCo group whose last rounds were discarded); its checkpoints say so."""


class PeerLost(Exception):
    """A collective failed because another process of the run is gone or stopped answering."""
