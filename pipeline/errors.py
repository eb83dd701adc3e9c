"""The one user-facing error type. The CLI turns it into a message and an exit code."""


class PipelineError(Exception):
    """An error the user can fix. `message` names the fix; `exit_code` is what the CLI returns."""

    def __init__(self, message: str, exit_code: int = 1, detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.detail = detail  # e.g. the tail of a log, printed after the message


class ConfigError(PipelineError):
    """Invalid configuration: exit code 2, one line per problem."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(problems), exit_code=2)
