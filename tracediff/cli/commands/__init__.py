"""One module per subcommand, each with ``register(subparsers)``."""

from . import align, capture

ALL = [capture, align]
