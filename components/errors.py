"""Errors that mean "the user gave bad input": the CLI prints them and exits 2."""


class UserError(Exception):
    """Bad input (config, file, flag). The message names what is wrong and where."""

    exit_code = 2
