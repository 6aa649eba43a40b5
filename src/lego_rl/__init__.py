"""lego-rl: reinforcement learning for coding agents through their real, unmodified CLIs."""

__version__ = "0.1.0"
