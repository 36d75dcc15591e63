"""Errors the CLI reports as one line and a non-zero exit, never a traceback."""


class CliError(Exception):
    """A failure to report as one line (`error: ...`) and exit code 2."""
