"""One module per subcommand, each with ``register(subparsers)``."""

from . import align, capture, demo, plot, replay, show, steps

ALL = [demo, capture, show, align, replay, plot, steps]
