"""What a patched call reports to: the one interface between an adapter's interception and the recorder."""

from __future__ import annotations

from typing import Any, Protocol


class CallObserver(Protocol):
    """What a patched call reports to (a torch or an MLX module). None of these may raise."""

    def enter(self, module: Any, path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...

    def exit(self, token: Any, output: Any) -> None: ...

    def error(self, token: Any, exc: BaseException) -> None: ...
