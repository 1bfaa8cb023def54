"""The one error type users see for bad input: key, value, what is allowed."""


class ConfigError(ValueError):
    """A bad config value, reported as one line before any training starts."""

    def __init__(self, key: str, value, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"invalid config: {key}={value!r} — {allowed}")


class RunFailed(RuntimeError):
    """Training diverged or the run cannot continue (the run is marked failed)."""


class Diverged(RunFailed):
    """The training loss blew up (non-finite, or above ``divergence.factor`` x the reference): status ``diverged``."""


class WriteFailed(RunFailed):
    """A file of the run could not be written (disk full, quota, permissions): names the path and the cause."""

    def __init__(self, path, cause: OSError):
        self.path, self.cause = path, cause
        super().__init__(f"cannot write {path}: {cause.strerror or cause}")


class RunDirBusy(RuntimeError):
    """Another live run holds the run directory's lock."""
