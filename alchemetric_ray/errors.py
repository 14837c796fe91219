"""The base of every error that is the user's to fix: the CLI prints its one-line message and exits 2."""


class UserError(Exception):
    """Bad input, config or environment. ``str(err)`` is one line naming the file, key or value."""
