"""The Slurm-Triton bridge: the daemon that lends GPU nodes between Slurm pools and
Triton Inference Server, its adapters, and the one-host lab cluster (`bridge.lab`)."""

__version__ = "0.1.0"
