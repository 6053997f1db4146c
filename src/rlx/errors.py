"""Errors that are the user's to fix: the CLI prints them as one message and exits with code 2."""


class UserError(Exception):
    """A mistake in the user's input (config, data, model folder), reported without a traceback."""


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (its type when it has none), for a one-line error."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


MESSAGE_CHARS = 2000  # of an exception's message kept in a record: user code may raise with megabytes


def described(exc: BaseException) -> str:
    """``Type: message``, the message cut to ``MESSAGE_CHARS`` characters (with how long it was): what a
    record keeps of a failure in user code (a tool, an environment, a judger)."""
    message = str(exc)
    if len(message) > MESSAGE_CHARS:
        message = f"{message[:MESSAGE_CHARS]}... ({len(message):,} characters)"
    return f"{type(exc).__name__}: {message}"
