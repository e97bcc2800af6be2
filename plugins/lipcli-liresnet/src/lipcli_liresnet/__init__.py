"""lipcli-liresnet: the LiResNet architecture and the EMMA loss (Hu et al., NeurIPS 2023)."""

__version__ = "0.1.0"
