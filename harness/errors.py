"""The one exception family the CLI turns into a single line on stderr."""


class HarnessError(Exception):
    """A failure the user can act on; its str() is the whole message, one line."""

    exit_code = 2
