"""Errors that are the user's to fix: the CLI prints them as one message and exits with code 2."""


class UserError(Exception):
    """A mistake in the user's input (config, data, model folder), reported without a traceback."""
