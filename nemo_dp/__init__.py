"""nemo_dp: a Hydra-configured LLM post-training toolkit built around a per-sample data plane.

Importing the package is cheap and never imports Ray or TransferQueue; subpackages load what
they need when they are used.
"""

__version__ = "0.1.0"
