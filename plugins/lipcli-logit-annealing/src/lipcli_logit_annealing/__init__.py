"""lipcli-logit-annealing: the Logit Annealing loss (Lai et al., ICLR 2025, BRONet)."""

__version__ = "0.1.0"
