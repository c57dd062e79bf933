"""One module per subcommand, each with ``register(subparsers)``."""

from . import align, capture, demo, plot, show, steps

ALL = [demo, capture, show, align, plot, steps]
