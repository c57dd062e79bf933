"""Replay: run the port's own modules on the reference's recorded inputs.

``tracediff.replay(model_b, trace_a)`` answers "which of my modules is
wrong?": every module call of B that matches a node of A's trace runs alone
on A's recorded inputs, its outputs are compared with A's (the module's local
error, free of everything upstream), and a float64 run of the same module
tells B's math apart from B's precision. See :mod:`.engine` for a tour.
"""

from .engine import replay
from .oracle import NOISE_MULTIPLIER
from .result import Replay, ReplayedCall, ReplayedTensor, SkippedCall

__all__ = ["replay", "Replay", "ReplayedCall", "ReplayedTensor", "SkippedCall", "NOISE_MULTIPLIER"]
