"""The one exception family the CLI turns into a single line on stderr, and the interrupt."""

import signal


class HarnessError(Exception):
    """A failure the user can act on; its str() is the whole message, one line."""

    exit_code = 2


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; `signum` says which (the exit code is 128 + signum)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
