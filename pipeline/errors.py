"""The errors a user can fix. Each names the fix in its message; its class says the exit code, which the
CLI (pipeline/cli/) returns after printing the message - never a traceback.

    LpxError      1  anything the user can fix that is not one of the below
    UsageError    2  a bad flag, config value or input file: change what was passed
    ConfigError   2  lpx.yaml does not validate: one `path: message` line per problem
    NotFound      1  something LPX needs is missing: an artifact, a program, a running server
    StageFailed   1  a stage's tool or child process failed (trtllm-build, tritonserver, the quality gate)
"""

from __future__ import annotations


class LpxError(Exception):
    """An error the user can fix. `message` names the fix; `detail` (e.g. a log tail) follows it."""

    exit_code = 1

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.detail = detail


class UsageError(LpxError):
    """A bad flag, config value or input: exit code 2."""

    exit_code = 2


class ConfigError(UsageError):
    """Invalid configuration: exit code 2, one line per problem."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(problems))


class NotFound(LpxError):
    """Something LPX needs does not exist (yet): an artifact, a program, a running server."""


class StageFailed(LpxError):
    """A stage's tool or child process failed, or its result is refused (the quality gate)."""
