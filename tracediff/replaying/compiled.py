"""Replaying a model that runs under ``torch.compile``: each module replayed runs compiled, as B runs it.

A SPEC may return ``torch.compile(model)``, a model compiled with ``model.compile()``, or one with compiled
layers. Replay then works on the model's own modules and paths (``uncompiled``, ``own_modules``: no
``_orig_mod``), and runs each replayed module through its own ``torch.compile(module, dynamic=False)``, made
once per module, so a mistake that only compiled code makes (a ``torch.compiler.is_compiling()`` branch, a
decomposition that differs from its kernel) is seen at the module that holds it.

The float64 oracle is not used for a compiled B: each row is judged against the tolerances (``atol``,
``rtol``; default torch.testing's for the dtypes). The oracle tells B's math from B's precision by running
B's own code in float64 and calling B's distance to that run B's precision noise; an eager float64 run would
count a compile-only mistake as B's precision noise (and pass it), and the float64 copy (its casting hooks
and op mode) does not run under ``torch.compile``. The shadow run that gives B's call tree is eager too (its
hooks read statistics, on which compiled code would break); B's end-to-end error is taken from B's compiled
model itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, cast

import torch
from torch import nn

from ..capturing.compiled import has_compiled_region, is_optimized_module, own_modules, uncompiled
from .shadow import seed_rng

NO_ORACLE_WHEN_COMPILED = ("B runs under torch.compile: each module was replayed compiled and judged against the "
                           "tolerances, without the float64 oracle (an eager float64 run would count a compile-only "
                           "difference as B's precision noise)")

__all__ = ["NO_ORACLE_WHEN_COMPILED", "CompiledB", "CompiledRuns", "EagerB", "compiling", "eager", "how_b_runs",
           "is_compiled", "own_module_table", "uncompiled"]


def is_compiled(model: Any) -> bool:
    """True when ``model`` runs compiled: ``torch.compile(model)``, ``model.compile()`` or compiled layers."""
    return is_optimized_module(model) or has_compiled_region(uncompiled(model))


def own_module_table(model: nn.Module) -> dict[str, nn.Module]:
    """``relative path -> module`` under the model's own paths (a compiled layer's wrapper left out)."""
    return dict(own_modules(model))


def eager(compiled: bool) -> Any:
    """A context in which compiled code runs eager (when ``compiled``; nothing otherwise)."""
    return torch.compiler.set_stance("force_eager") if compiled else nullcontext()


@contextmanager
def compiling(compiled: bool, modules: int) -> Iterator[None]:
    """Dynamo's settings for a replay of a compiled B with ``modules`` modules (nothing when not ``compiled``).

    * Code compiled in the block guards on module hooks: a hook added later (a patched rerun replaces a
      call's output with one) makes it recompile, where by default it would be silently ignored.
    * Every module compiled runs the same code object (``Module._call_impl``), so each module (and its float64
      twin, and each patched rerun) is one more compilation of it: the limit is raised to what the replay
      needs, and reaching it raises (the call is then reported as not comparable) where by default the
      module would silently run eager.
    """
    if not compiled:
        yield
        return
    import torch._dynamo

    limit = max(64, 8 * modules)
    with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False, recompile_limit=limit,
                                    accumulated_recompile_limit=max(256, 2 * limit),
                                    fail_on_recompile_limit_hit=True):
        yield


class CompiledRuns:
    """``torch.compile(module, dynamic=False)`` for each module replayed, made on first use and kept."""

    def __init__(self) -> None:
        self._compiled: dict[int, tuple[nn.Module, nn.Module]] = {}

    def __call__(self, module: nn.Module) -> nn.Module:
        if id(module) not in self._compiled:  # the module is kept with it: its id stays its own
            self._compiled[id(module)] = (module, cast(nn.Module, torch.compile(module, dynamic=False)))
        return self._compiled[id(module)][1]


class EagerB:
    """How replay runs an eager B: its modules as they are, its end-to-end output the shadow run's."""

    compiled = False
    #: whether the float64 oracle may judge B's rows (not for a compiled B: see the module's docstring)
    oracle_allowed = True

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def settings(self) -> AbstractContextManager[None]:
        """The settings the whole replay runs under."""
        return nullcontext()

    def module_table(self) -> dict[str, nn.Module]:
        """``relative path -> module`` of B's own modules."""
        return dict(self.model.named_modules(remove_duplicate=False))

    def call_tree(self) -> AbstractContextManager[Any]:
        """The context of the shadow run, whose hooks read statistics."""
        return nullcontext()

    def runnable(self, module: nn.Module) -> nn.Module:
        """What runs when ``module`` is replayed alone."""
        return module

    def whole(self) -> nn.Module:
        """What runs B's whole forward (a patched rerun)."""
        return self.model

    def final_output(self, shadow_output: Any, root_inputs: tuple[tuple[Any, ...], dict[str, Any]], seed: int,
                     warnings: list[str]) -> Any:
        """B's final output on A's top-level inputs: the shadow run's."""
        return shadow_output


class CompiledB(EagerB):
    """How replay runs a compiled B: each module replayed through its own ``torch.compile``, the call tree
    taken eager, the end-to-end output from B's compiled model, no float64 oracle."""

    compiled = True
    oracle_allowed = False

    def __init__(self, model: nn.Module, compiled_model: nn.Module) -> None:
        super().__init__(model)
        self.compiled_model = compiled_model  # B as its SPEC runs it
        self._runs = CompiledRuns()

    def settings(self) -> AbstractContextManager[None]:
        return compiling(True, len(list(self.model.modules())))

    def module_table(self) -> dict[str, nn.Module]:
        return own_module_table(self.model)

    def call_tree(self) -> AbstractContextManager[Any]:
        return cast(AbstractContextManager[Any], eager(True))

    def runnable(self, module: nn.Module) -> nn.Module:
        return self._runs(module)

    def whole(self) -> nn.Module:
        return self.compiled_model

    def final_output(self, shadow_output: Any, root_inputs: tuple[tuple[Any, ...], dict[str, Any]], seed: int,
                     warnings: list[str]) -> Any:
        """B's final output as its SPEC's compiled model computes it (the shadow run's when that raises)."""
        args, kwargs = root_inputs
        with torch.no_grad():
            seed_rng(seed)
            try:
                return self.compiled_model(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the port's compiled code; the eager output stands in
                warnings.append(f"B's compiled model raised {type(e).__name__} on A's top-level inputs: the "
                                "end-to-end error is the eager run's")
                return shadow_output


def how_b_runs(model_b: nn.Module) -> EagerB:
    """``CompiledB`` for a model that runs compiled (its own modules and paths, never ``_orig_mod``), else
    ``EagerB``."""
    if is_compiled(model_b):
        return CompiledB(uncompiled(model_b), model_b)
    return EagerB(uncompiled(model_b))
