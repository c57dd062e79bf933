"""One module per subcommand, each with ``register(subparsers)``."""

from . import align, attribute, capture, demo, import_dump, plot, replay, show, steps

#: Each subcommand's module by the name it registers.
BY_NAME = {"demo": demo, "capture": capture, import_dump.COMMAND: import_dump, "show": show, "align": align,
           "replay": replay, "attribute": attribute, "plot": plot, "steps": steps}
ALL = list(BY_NAME.values())
