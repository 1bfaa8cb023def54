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


def signal_name(signum: int) -> str:
    import signal

    return signal.Signals(signum).name


def describe(e: BaseException) -> str:
    """One line for an error: a config error or a failed write as they say, an OSError as its path and cause."""
    from .preemption import Preempted  # (the same layer)

    if isinstance(e, (ConfigError, RunFailed)):
        return str(e)
    if isinstance(e, Preempted):
        return f"{signal_name(e.signum)} received"
    if isinstance(e, OSError) and e.filename:
        return f"cannot use {e.filename}: {e.strerror or e}"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first}"
