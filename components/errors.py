"""Errors that mean "the user gave bad input": the CLI prints them and exits 2."""

from components.redact import redact


class UserError(Exception):
    """Bad input (config, file, flag). The message names what is wrong and where.

    A URI password in the message is replaced by ``***`` (:func:`components.redact.redact`):
    these messages are printed, logged by Prefect and stored in run results."""

    exit_code = 2

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))
