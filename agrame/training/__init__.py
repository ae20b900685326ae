"""Training: the multi-granular student, its loop and loss, WiSE-FT mixing, and ``agrame train`` on a user's own
pairs (:mod:`agrame.training.trainer`). The research scripts of the repository's ``training/`` folder and the GPU
bundle call this same core; the product installs no top-level ``training`` package (issue 60)."""

from .trainer import TrainSettings, train

__all__ = ["TrainSettings", "train"]
