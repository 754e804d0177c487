"""ringzero: train one large model on many devices, plan it, and check the plan against the run."""

__version__ = "0.1.0"
