"""``hydra/launcher=parallel`` (conf/hydra/launcher/parallel.yaml): Hydra's joblib launcher, with one line (not a
joblib traceback) when a worker process dies — killed, or out of memory. joblib then stops the pool, the other
running jobs with it; their status.json files say ``running`` for dead processes, which every reader takes as
``lost`` (:func:`fedbench.rundir.process_gone`), and the sweep's summary line counts them. The same command resumes
each from its last checkpoint."""

from __future__ import annotations

import sys

try:  # the cluster extra (pip install -e ".[cluster]"); Hydra imports every hydra_plugins module at start
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
except ImportError:  # pragma: no cover - without it hydra/launcher=parallel is refused by Hydra itself
    JoblibLauncher = object


class ParallelLauncher(JoblibLauncher):
    def launch(self, job_overrides, initial_job_idx):
        from joblib.externals.loky.process_executor import TerminatedWorkerError

        try:
            return super().launch(job_overrides, initial_job_idx)
        except TerminatedWorkerError as e:
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(
                f"fedbench: a worker process of hydra/launcher=parallel died ({why}); joblib stopped the sweep's "
                "other running jobs with it — the same command resumes them from their last checkpoints",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(1) from None
