"""The one error type users see for bad input: key, value, what is allowed."""


class ConfigError(ValueError):
    """A bad config value, reported as one line before any training starts."""

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid config: {key}={value!r} — {allowed}")


class RunFailed(RuntimeError):
    """Training diverged or the run cannot continue (the run is marked failed)."""
