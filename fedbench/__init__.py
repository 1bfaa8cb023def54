"""fedbench: simulated (personalized) federated learning experiments, configured by Hydra."""

from . import config as _config  # noqa: F401  (registers the ${scaled:...} resolver for every entry point)

__version__ = "0.1.0"
