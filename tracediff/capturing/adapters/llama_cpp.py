"""The llama.cpp adapter: every node of the ggml graphs a ``llama_cpp.Llama`` evaluates, with its dataflow.

llama.cpp runs no Python modules: each decode call builds a ggml graph (``embd``, ``attn_norm-0``,
``Qcur-0``, ..., ``result_output``) and computes it. llama.cpp's eval callback
(``llama_context_params.cb_eval``, a ``ggml_backend_sched_eval_callback``) is asked about every node before
it is computed and told after each node it wanted; the adapter wants every node that ggml computes and
reads a view (``RESHAPE``, ``VIEW``, ``PERMUTE``, ``TRANSPOSE``: no computation) when asked, so that ggml
computes it with the next node rather than as a graph of its own. It reads the node's ``struct ggml_tensor``
(:mod:`.ggml_tensor`) and feeds the capture's ``GraphNodeSink`` (:mod:`tracediff.capturing.graph`):

* the node's name split at its ``-N`` suffix: ``attn_norm-0`` is ``attn_norm`` in scope ``blk.0``, so that
  every block's nodes are the calls of one structure; a name repeated (``Qcur-0`` after the projection, the
  reshape and the rope) gets the next call index; llama.cpp's `` (view)`` suffixes are dropped from the name
  and kept in the node's attributes;
* its op (``MUL_MAT``, ``RMS_NORM``, ``ROPE``, ``SILU``...), its sources (the nodes it read; a weight or an
  input of the graph is an external source, by its name) and the op parameters that change numerics (an
  RMS norm's ``eps``, a rope's mode and base, an attention's scale);
* its data in torch's dimension order (ggml's ``ne`` reversed), of its own type (F32, F16, BF16,
  integers; a quantized KV cache view dequantized to float32, said in ``attributes``).

Each ``llama_decode`` is a step (as each forward of ``generate`` is). The callback is set on a context of
its own: ``install`` creates a context with the ``Llama``'s own settings plus the callback, and the
``Llama`` evaluates in it until ``restore()`` frees it and puts the ``Llama``'s context and token count back.
A capture therefore starts from an empty KV cache. The ``Llama``'s settings that change numerics (the
KV-cache types ``type_k``/``type_v``, flash attention, threads) and the GGUF's own metadata (architecture,
hyper-parameters, the types of the weights the graphs read) are written in the trace metadata's
``runtime``.

Create the ``Llama`` with ``logits_all=True`` to compare every position: otherwise llama.cpp computes the
last layer's output for the last token only. ``tracediff capture model.gguf --inputs FILE`` does that
(:func:`LlamaCppAdapter.load`). llama_cpp is never imported unless a ``Llama`` exists or a ``.gguf`` is
captured from the command line.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from ...errors import UsageError
from ...files.confine import check_regular_file
from ...trace.vocabulary import GraphVocabulary
from .base import AdapterBase, Installed, Recorder, RuntimeOption

FRAMEWORK = "llama.cpp"
INSTALL = 'pip install -c constraints.txt -e ".[llama]"'
#: ``--kv-cache-type`` choices, as ggml names the types.
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0")
_GGML_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8}
_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
_SCOPED = re.compile(r"^(?P<name>.+)-(?P<block>\d+)$")
#: What ggml's ops mean to alignment (tracediff.trace.vocabulary), written into every trace this adapter captures.
VOCABULARY = GraphVocabulary(
    scopes="blocks", views=frozenset({"RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "CONT", "CPY"}),
    same_values=frozenset({"RESHAPE", "CONT"}), rotary=frozenset({"ROPE", "ROPE_BACK"}),
    approximations={"FLASH_ATTN_EXT": "ggml_flash_attention_f16", "GELU": "ggml_gelu_f16_table",
                    "GEGLU": "ggml_geglu_f16_table"})
OPTIONS = (
    RuntimeOption("kv_cache_type", choices=KV_CACHE_TYPES,
                  help="type of the KV cache's K and V (default llama.cpp's f16; f32 for a cache that rounds nothing)"),
    RuntimeOption("flash_attn", choices=tuple(_FLASH_ATTN), help="flash attention (default auto)"),
    RuntimeOption("threads", kind="int", metavar="N", help="llama.cpp's threads (default llama-cpp-python's)"),
)


def split_name(raw: str) -> tuple[str, str | None, str | None]:
    """A ggml node name as (name, scope, suffix): ``"attn_norm-0"`` -> ``("attn_norm", "blk.0", None)``,
    ``"cache_k_l0 (view) (permuted)"`` -> ``("cache_k_l0", None, "(view) (permuted)")``."""
    base, _, suffix = raw.partition(" (")
    base = re.sub(r"[^\w.-]", "_", base) or "node"
    match = _SCOPED.match(base)
    scope = None
    if match is not None:
        base, scope = match["name"], f"blk.{int(match['block'])}"
    return base, scope, f"({suffix}" if suffix else None


def llama_module() -> Any:
    """The imported ``llama_cpp`` package, or None (never imports it)."""
    return sys.modules.get("llama_cpp")


def is_llama(model: Any) -> bool:
    """True when ``model`` is a ``llama_cpp.Llama`` (without importing llama_cpp)."""
    llama_type = getattr(llama_module(), "Llama", None)
    return isinstance(llama_type, type) and isinstance(model, llama_type)


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as e:
        raise UsageError(f"llama-cpp-python is not installed ({e}): {INSTALL}") from None
    except OSError as e:  # installed without its shared library (a build that failed halfway)
        raise UsageError(f"llama-cpp-python cannot load llama.cpp's library ({e}): {INSTALL}") from None
    return llama_cpp


def _callback_type(llama_cpp: Any) -> Any:
    """llama-cpp-python's ``ggml_backend_sched_eval_callback``; UsageError when this version has none."""
    params = getattr(llama_cpp, "llama_context_params", None)
    fields = {name for name, *_ in getattr(params, "_fields_", ())}
    callback = getattr(llama_cpp, "ggml_backend_sched_eval_callback", None)
    if callback is None or "cb_eval" not in fields:
        raise UsageError(f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} has no eval callback "
                         "(llama_context_params.cb_eval): tracediff needs it to see the graph's nodes; "
                         f"{INSTALL}")
    return callback


def _ggml(llama_cpp: Any) -> Any:
    from .ggml_tensor import GgmlLibrary

    try:
        from llama_cpp import _ggml

        handle = _ggml.libggml
    except (ImportError, AttributeError, OSError):
        handle = llama_cpp.llama_cpp._lib  # libllama links ggml: its symbols are found through it
    return GgmlLibrary(handle)


class GraphRecording:
    """The eval callback on a context of its own, in place in a ``Llama`` until ``restore()``."""

    def __init__(self, llm: Any, recorder: Recorder, facts: dict[str, Any]) -> None:
        llama_cpp = _import_llama_cpp()
        callback_type = _callback_type(llama_cpp)
        if not hasattr(llm, "_ctx") or not hasattr(llm, "context_params") or not hasattr(llm, "_model"):
            raise UsageError(f"llama-cpp-python {llama_cpp.__version__}: a Llama without _ctx, _model or "
                             f"context_params: {INSTALL}")
        from llama_cpp import _internals

        self._llm, self._recorder, self._facts = llm, recorder, facts
        self._lib = _ggml(llama_cpp)
        self._step = -1
        self._keys: dict[int, tuple[int, int]] = {}  # node address -> key, in the open step
        self._index = 0
        self._callback = callback_type(self._on_node)  # kept alive while the context may call it
        params = llama_cpp.llama_context_params.from_buffer_copy(llm.context_params)
        params.cb_eval = self._callback
        params.cb_eval_user_data = None
        # Any, with llama-cpp-python's types installed or not: its decode method is replaced below
        self._context = cast(Any, _internals.LlamaContext(model=llm._model, params=params, verbose=False))
        decode = self._context.decode

        def stepped(batch: Any) -> Any:
            self._begin()
            try:
                return decode(batch)
            finally:
                recorder.end_step()

        self._context.decode = stepped  # each llama_decode is one step
        self._saved = (llm._ctx, llm.n_tokens)
        llm._ctx, llm.n_tokens = self._context, 0
        facts.setdefault("weight_types", {})
        facts["flash_attn_used"] = False

    def _begin(self) -> None:
        self._step += 1
        self._keys, self._index = {}, 0
        self._recorder.begin_step()

    def _on_node(self, address: int, ask: bool, _user_data: Any) -> bool:
        """ggml's callback, twice per node it asks about; never raises.

        Asked before a node is computed (``ask``): a view ggml computes nothing for is recorded at once and
        declined (False), so that ggml computes it with the next node instead of as a graph of its own (each
        graph ggml computes for the callback costs a wake-up of its threads); every other node is wanted
        (True). Told after a node is computed: record it, and go on (True; False would stop the graph).
        Every node before the one asked about has been computed then, and a view's memory is its source's,
        which no node overwrites while the view has readers still to run: its values are those it has after
        its (empty) computation.
        """
        if ask:
            try:
                if not self._lib.computes_nothing(int(address)):
                    return True
            except Exception:  # noqa: BLE001 - unreadable here: wanted, and read again once computed
                return True
        try:
            self._record(int(address))
        except Exception as e:  # noqa: BLE001 - an exception must not cross into ggml; the node is recorded as failed
            self._recorder.record_node(key=("unreadable", self._step, self._index), name="unreadable", op="?",
                                       scope=None, output=_Unreadable(e))  # type: ignore[arg-type]
        return not ask

    def _record(self, address: int) -> None:
        from .ggml_tensor import read_data, view

        if self._step < 0:  # a decode made around the Llama (llama_cpp.llama_decode on llm.ctx)
            self._begin()
        node, tensor = view(self._lib, address)
        name, scope, suffix = split_name(node.name)
        key = (self._step, self._index)
        self._index += 1
        sources: list[Any] = []
        for source in node.sources:
            known = self._keys.get(source)
            if known is None:
                external = node.source_names.get(source, "?")
                self._facts["weight_types"].setdefault(external, node.source_types.get(source, "?"))
                sources.append(external)
            else:
                sources.append(known)
        data = read_data(self._lib, tensor, node.shape)  # ggml's memory: recorded before this returns
        from ...files.host import host_tensor

        output: Any = host_tensor(data, bits_of="bfloat16") if node.type_name.lower() == "bf16" else data
        attributes: dict[str, Any] = {"ggml_name": node.name, "ggml_type": node.type_name, **node.attributes}
        if suffix:
            attributes["view"] = suffix
        if node.type_name.lower() not in ("f32", "f16", "bf16", "i8", "i16", "i32", "i64", "f64"):
            attributes["dequantized"] = True
        if node.op == "FLASH_ATTN_EXT":
            self._facts["flash_attn_used"] = True
        self._recorder.record_node(key=key, name=name, op=node.op, scope=scope, output=output, sources=sources,
                                   attributes=attributes)
        self._keys[address] = key

    def restore(self) -> None:
        """Free the capture's context and give the ``Llama`` its own back, with its token count."""
        llm = self._llm
        if llm._ctx is self._context:
            llm._ctx, llm.n_tokens = self._saved
        self._context.close()


class _Unreadable:
    """An output the recorder writes as a repr: a node the adapter could not read, and why."""

    def __init__(self, error: Exception) -> None:
        self._text = f"<unreadable ggml node: {type(error).__name__}: {error}>"

    def __repr__(self) -> str:
        return self._text


def runtime_facts(llm: Any, facts: Mapping[str, Any]) -> dict[str, Any]:
    """The trace metadata's ``runtime``: the GGUF's metadata and the context settings that change numerics."""
    meta: dict[str, str] = dict(getattr(llm, "metadata", None) or {})
    architecture = meta.get("general.architecture")
    params = llm.context_params
    llama_cpp = llama_module()
    types = {value: name for name, value in _GGML_TYPES.items()}
    flash = {value: name for name, value in _FLASH_ATTN.items()}.get(int(params.flash_attn_type), "?")
    return {
        "gguf": Path(str(getattr(llm, "model_path", "") or "")).name or None,
        "llama_cpp_python_version": getattr(llama_cpp, "__version__", None),
        "architecture": architecture,
        "file_type": meta.get("general.file_type"),
        "hyperparameters": {key: value for key, value in sorted(meta.items())
                            if architecture and key.startswith(f"{architecture}.")},
        "tokenizer_model": meta.get("tokenizer.ggml.model"),
        "kv_cache_type": {"k": types.get(int(params.type_k), str(params.type_k)),
                          "v": types.get(int(params.type_v), str(params.type_v))},
        "flash_attn": flash,
        "flash_attn_used": bool(facts.get("flash_attn_used", False)),
        "threads": int(params.n_threads),
        "threads_batch": int(params.n_threads_batch),
        "n_ctx": int(params.n_ctx),
        "weight_types": dict(sorted(facts.get("weight_types", {}).items())),
    }


_TOKEN_MAX = 2**31 - 1  # llama_token is an int32_t


class LlamaCppAdapter(AdapterBase):
    """llama.cpp models (``llama_cpp.Llama``): every node of the ggml graphs each decode computes."""

    framework = FRAMEWORK
    models = "llama.cpp"
    supported_options: frozenset[str] = frozenset()
    graph = VOCABULARY
    file_kind = "a GGUF file (llama.cpp: tracediff capture model.gguf --inputs FILE)"
    options = OPTIONS

    def __init__(self) -> None:
        self._facts: dict[int, dict[str, Any]] = {}  # id(model) -> what the capture saw of it

    def recognises(self, model: Any) -> bool:
        return is_llama(model)

    def version(self) -> str | None:
        return getattr(llama_module(), "__version__", None)

    def install(self, model: Any, recorder: Recorder, options: Mapping[str, Any]) -> Installed:
        facts = self._facts.setdefault(id(model), {})
        return GraphRecording(model, recorder, facts)

    def host(self, value: Any) -> Any:
        return value

    def metadata(self, model: Any) -> dict[str, Any]:
        return {"model_class": type(model).__name__,
                "runtime": runtime_facts(model, self._facts.get(id(model), {}))}

    def opens(self, path: Path) -> bool:
        return path.suffix.lower() == ".gguf"

    def load(self, path: Path, options: Mapping[str, Any]) -> Any:
        """A ``Llama`` of the GGUF file ``path`` on the CPU, every position's logits kept.

        ``options``: ``kv_cache_type`` (one of ``KV_CACHE_TYPES``, K and V; default llama.cpp's f16),
        ``flash_attn`` (``"auto"``, ``"on"``, ``"off"``; default llama.cpp's auto), ``threads`` (default
        llama-cpp-python's), ``n_ctx`` (default 0: the model's training context). Raises UsageError for a
        file that is no GGUF or that llama.cpp cannot load.
        """
        check_gguf(path)
        llama_cpp = _import_llama_cpp()
        _callback_type(llama_cpp)
        kv = str(options.get("kv_cache_type") or "f16")
        if kv not in _GGML_TYPES:
            raise UsageError(f"kv_cache_type={kv!r}: expected one of {', '.join(KV_CACHE_TYPES)}")
        flash = str(options.get("flash_attn") or "auto")
        if flash not in _FLASH_ATTN:
            raise UsageError(f"flash_attn={flash!r}: expected auto, on or off")
        settings: dict[str, Any] = {"model_path": str(path), "n_ctx": int(options.get("n_ctx") or 0),
                                    "n_gpu_layers": 0, "logits_all": True, "verbose": False,
                                    "type_k": _GGML_TYPES[kv], "type_v": _GGML_TYPES[kv]}
        if options.get("threads"):
            settings["n_threads"] = settings["n_threads_batch"] = int(options["threads"])
        try:
            llm = llama_cpp.Llama(**settings)
        except (ValueError, RuntimeError, OSError) as e:
            raise UsageError(f"{path}: llama.cpp could not load it: {_first_line(e)}") from None
        llm.context_params.flash_attn_type = _FLASH_ATTN[flash]  # read when the capture makes its context
        return llm

    def check_inputs(self, inputs: Mapping[str, Any], source: str = "inputs") -> None:
        """UsageError unless ``inputs`` hold one sequence of token ids (:func:`token_ids`); ``source`` names
        the inputs file in the message."""
        token_ids(inputs, source)

    def check_run(self, model: Any, inputs: Mapping[str, Any], source: str = "inputs") -> None:
        """UsageError unless the loaded ``model`` can decode the token ids of ``inputs``: each id in its
        vocabulary, no more of them than its context holds (llama.cpp would fail inside the decode)."""
        ids = token_ids(inputs, source)
        name = Path(str(getattr(model, "model_path", "") or "the model")).name
        vocab, context = int(model.n_vocab()), int(model.n_ctx())
        for position, token in enumerate(ids):
            if token >= vocab:
                raise UsageError(f"{source}: token id {token} at position {position} is outside the vocabulary of "
                                 f"{name} ({vocab} tokens: ids 0 to {vocab - 1})")
        if len(ids) > context:
            raise UsageError(f"{source}: {len(ids)} token ids, more than the context of {name} holds "
                             f"({context} tokens)")

    def run_inputs(self, model: Any, inputs: Mapping[str, Any]) -> None:
        """Decode the prompt ``token_ids(inputs)`` once from an empty cache (one step per llama_decode)."""
        model.reset()
        model.eval(token_ids(inputs))


def check_gguf(path: Path) -> None:
    """UsageError unless ``path`` is a regular file starting with GGUF's magic (a directory or a FIFO named
    ``x.gguf`` is refused as what it is, without blocking on the FIFO)."""
    check_regular_file(path, error=UsageError, what="model file", missing="no such file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise UsageError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")


def token_ids(inputs: Mapping[str, Any], source: str = "inputs") -> list[int]:
    """The prompt's token ids: ``kwargs.input_ids``, else the only integer tensor; one sequence of integers,
    none negative or beyond llama.cpp's 32-bit token type.

    Raises UsageError, its message starting with ``source`` (the inputs file), naming the keys found when
    neither exists, or the first id that no model could decode.
    """
    import torch

    value = inputs.get("kwargs.input_ids")
    if value is None:
        integers = [key for key, tensor in inputs.items()
                    if isinstance(tensor, torch.Tensor) and not tensor.is_floating_point()
                    and not tensor.is_complex() and tensor.dtype != torch.bool]
        if len(integers) != 1:
            raise UsageError(f"{source}: expected the token ids as kwargs.input_ids or as the only integer tensor, "
                             f"found {', '.join(sorted(inputs)) or 'nothing'}")
        value = inputs[integers[0]]
    tensor = torch.as_tensor(value)
    if tensor.dim() == 2 and tensor.shape[0] == 1:
        tensor = tensor[0]
    if tensor.dim() != 1 or tensor.numel() == 0:
        raise UsageError(f"{source}: the token ids must be one sequence ([T] or [1, T]), got shape "
                         f"{list(tensor.shape)}")
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise UsageError(f"{source}: the token ids must be integers, got {str(tensor.dtype).removeprefix('torch.')}")
    ids = [int(t) for t in tensor.tolist()]
    for position, token in enumerate(ids):
        if token < 0:
            raise UsageError(f"{source}: token id {token} at position {position} is negative")
        if token > _TOKEN_MAX:
            raise UsageError(f"{source}: token id {token} at position {position} does not fit llama.cpp's 32-bit "
                             f"token ids (at most {_TOKEN_MAX})")
    return ids


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


__all__ = ["FRAMEWORK", "KV_CACHE_TYPES", "LlamaCppAdapter", "check_gguf", "is_llama", "split_name", "token_ids"]
