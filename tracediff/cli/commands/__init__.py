"""One module per subcommand, each with ``register(subparsers)``."""

from . import capture

ALL = [capture]
