"""The base of every error that is the user's to fix: the CLI prints its one-line message and exits 2."""


class UserError(Exception):
    """Bad input, config or environment. ``str(err)`` is one line naming the file, key or value."""


class Interrupted(UserError, KeyboardInterrupt):
    """A run stopped by Ctrl-C (SIGINT), SIGTERM or SIGHUP after keeping what it finished: the CLI
    prints the message with the command that continues it (``resumable``) and exits as a shell
    reports that signal (130, 143, 129: ``interrupts.exit_code``)."""

    def __init__(self, message: str, *, resumable: bool = True, remedy: str = "run the same command again") -> None:
        super().__init__(message)
        self.resumable = resumable
        self.remedy = remedy  # what to do where the run cannot be resumed
