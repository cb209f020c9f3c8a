"""User-facing errors: the CLI prints their message as one line and exits non-zero, no traceback."""


class TmtError(Exception):
    """An error the user can fix; its message says what is wrong, where, and what to do."""

    exit_code = 1


class ConfigError(TmtError):
    """The configuration (YAML file or --set override) is invalid."""

    exit_code = 2
