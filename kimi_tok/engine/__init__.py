"""How one call runs: the ``Policy`` (every setting, read once) and the ``Engine`` that picks
fused / shared parts / groups / hash-routed / processes for each call."""

from .engine import Encoded, Engine
from .policy import Policy

__all__ = ["Encoded", "Engine", "Policy"]
