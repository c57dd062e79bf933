"""One module per subcommand, each with ``register(subparsers)``."""

from . import align, capture, demo, import_dump, plot, replay, show, steps

ALL = [demo, capture, import_dump, show, align, replay, plot, steps]
