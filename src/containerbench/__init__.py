"""containerbench: what containers and interconnects cost deep-learning training on HPC systems."""

__version__ = "0.1.0"
