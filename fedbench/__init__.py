"""fedbench: simulated (personalized) federated learning experiments, configured by Hydra."""

__version__ = "0.1.0"
