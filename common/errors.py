"""User mistakes, told apart from bugs.

A mistake in settings, data or a checkpoint raises a ``UserError`` whose message names
the setting or file and says how to fix it. ``train.py`` (and the scripts) print it as
one ``error:`` line on rank 0 and exit with code 2; any other exception is a bug in the
code and keeps its traceback.
"""


class UserError(Exception):
    """A mistake the user can fix; the message names what is wrong and the fix."""


class ConfigError(UserError, ValueError):
    """A setting that cannot work."""


class DataError(UserError, ValueError):
    """A corpus, file or tokenizer that cannot be used as configured."""


class CheckpointError(UserError, ValueError):
    """A checkpoint that is missing, unreadable or does not fit the configured run."""
