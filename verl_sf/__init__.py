"""verl-sf: isolated, fast, rate-limited code execution for RL rollouts."""

__version__ = "0.1.0"
