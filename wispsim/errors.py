"""Errors a user can act on.

Every problem with user input (a scenario file, a profile, a trace, a command-line option) is a
:class:`WispsimError` whose message is one line naming the file, the field and what is allowed.
The CLI prints that line and exits with code 2; it never shows a traceback for these.
"""

from __future__ import annotations


class WispsimError(Exception):
    """A problem with user input, explained in one line (control characters a hostile file name
    or key may carry, a newline or a carriage return included, are shown escaped)."""

    exit_code = 2

    def __init__(self, message: object = "") -> None:
        super().__init__(one_line(str(message)))


def one_line(text: str) -> str:
    """``text`` with every non-printable character escaped, so it prints as one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class ConfigError(WispsimError):
    """A scenario, profile or option has a bad value.

    ``source`` is the file (or "default scenario", "--devices", ...) and ``field`` the dotted path
    of the offending value, so the message reads ``scenario.yaml: server.verifier.delta_ms: must be >= 0,
    got -1``.
    """

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {problem}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str, str]]:
        # rebuilt from its parts where it crosses processes (a pool worker's point that fails)
        return type(self), (self.source, self.field, self.problem)


class EngineFailure(WispsimError):
    """A real engine failed mid-run (not bad input): one line naming the engine, the work it was
    doing and what was kept; exit code 1."""

    exit_code = 1


class TraceError(WispsimError):
    """An acceptance trace is missing columns, has bad values or cannot be read."""
