"""Errors that are the user's to fix: the CLI prints them as one message and exits with code 2."""


class UserError(Exception):
    """A mistake in the user's input (config, data, model folder), reported without a traceback."""


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (its type when it has none), for a one-line error."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
