"""The payload pipeline: payload files written by writer threads while the forward goes on.

A full capture hands every payload to ``PayloadPipeline.submit`` inside the
hook that records it. The tensor is first copied into a buffer of a bounded
pool of host memory, so that the model may change or free it afterwards; a
writer thread then writes the buffer to its file (``write_tensor_file``:
temporary file, one ``writev``, rename) and gives the buffer back.

* **CUDA.** Pool buffers are pinned; the copy is a non-blocking copy on a side
  stream that first waits for the producing kernels, and the forward's stream
  waits for the copy before its next kernel, so an in-place change of a
  recorded tensor can never overtake its copy. None of this blocks the host:
  the writer thread waits for the copy's event, not the forward.
* **CPU.** The copy is a plain ``memcpy`` into a reused buffer in the hook, and
  the file system calls run on the writer threads.
* **Back-pressure.** When the pool is full, ``submit`` waits for a writer to
  free a buffer: memory never grows with the model. A tensor larger than the
  whole pool is written directly in the hook, as without the pipeline.
* **Statistics.** ``submit`` takes an optional ``measure``: the writer thread
  calls it with the host copy before writing the file, so a tensor's
  statistics cost the forward nothing but the copy (issue 23). A journal line
  that waits for ``after_written`` therefore sees them complete.
* **Errors.** The first write error (a full disk) is kept and raised by the
  next ``submit`` and by ``close``, naming the file; payloads queued behind it
  are dropped and the capture marks its trace incomplete.

``writers=0`` writes every payload synchronously in the hook, with the same
bytes. ``default_writers`` picks 0 when there is no idle core for a writer
(measured: on two cores a writer thread next to torch's two intra-op threads
slows the capture down, see docs/performance.md).
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import OutputDirError, TracediffError, UsageError
from ..files.payloads import write_tensor_file
from .stats import StatsBuffers

DEFAULT_POOL_MB = 256
_ALIGN = 1 << 16  # buffers are sized in multiples of 64 KiB, so that they can be reused by similar tensors
# Computes a payload's statistics from its host copy and fills them into its entry; the buffers are the caller's.
Measure = Callable[[torch.Tensor, StatsBuffers], None]


def default_writers() -> int:
    """Writer threads for a capture: 2 when a CUDA device is in use or cores outnumber torch's threads, else 0."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return 2
    idle = (os.cpu_count() or 1) - torch.get_num_threads()
    return max(0, min(2, idle))


class HostPool:
    """Host buffers of at most ``capacity`` bytes in all, reused from tensor to tensor.

    ``acquire`` returns a free buffer that fits, allocates a new one while the
    total stays within ``capacity``, drops idle buffers that do not fit to make
    room, and otherwise waits for ``release``. ``peak`` is the most bytes ever
    allocated at once.
    """

    def __init__(self, capacity: int, *, pin: bool = False) -> None:
        self.capacity = capacity
        self.pin = pin
        self.allocated = 0
        self.peak = 0
        self._free: list[torch.Tensor] = []
        self._cond = threading.Condition()

    def acquire(self, nbytes: int, abandon: Callable[[], bool] = lambda: False) -> torch.Tensor | None:
        """A uint8 buffer of at least ``nbytes`` (``nbytes <= capacity``), or None once ``abandon()`` is true."""
        size = -(-nbytes // _ALIGN) * _ALIGN
        size = min(size, self.capacity) if nbytes <= self.capacity else size
        with self._cond:
            while True:
                if abandon():
                    return None
                fitting = [i for i, b in enumerate(self._free) if b.numel() >= nbytes]
                if fitting:  # the smallest that fits (by index: ``==`` on tensors compares elements)
                    return self._free.pop(min(fitting, key=lambda i: self._free[i].numel()))
                while self._free and self.allocated + size > self.capacity:
                    self.allocated -= self._free.pop().numel()  # idle and too small: make room
                if self.allocated + size <= self.capacity:
                    self.allocated += size
                    self.peak = max(self.peak, self.allocated)
                    return torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
                self._cond.wait(0.1)

    def release(self, buffer: torch.Tensor) -> None:
        with self._cond:
            self._free.append(buffer)
            self._cond.notify_all()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()


@dataclass
class _Job:
    path: Path
    view: torch.Tensor  # the payload, shaped as the tensor, inside ``buffer``
    buffer: torch.Tensor
    done: Any  # a CUDA event to wait for before reading ``view``, or None
    source: torch.Tensor | None  # kept alive until its copy has completed
    seq: int  # submission order, for ``after_written``
    measure: Measure | None


class PayloadPipeline:
    """Writes payload files on ``writers`` threads from a pool of ``pool_bytes`` of host memory.

    ``files`` and ``payload_bytes`` count what was written so far; read them
    after ``close``. Not reentrant: one capture, one pipeline.
    """

    def __init__(self, *, writers: int, pool_bytes: int = DEFAULT_POOL_MB << 20,
                 write: Callable[[Path, torch.Tensor], int] | None = None) -> None:
        if writers < 0 or pool_bytes < 0:
            raise ValueError(f"writers={writers}, pool_bytes={pool_bytes}: expected non-negative numbers")
        self.writers = writers
        self.pool = HostPool(pool_bytes, pin=writers > 0 and torch.cuda.is_available())
        self.files = 0
        self.payload_bytes = 0
        self.error: TracediffError | None = None
        self._write = write or write_tensor_file
        self._lock = threading.Lock()
        self._submitted = 0  # queued jobs so far
        self._written = 0  # every queued job below this number is done
        self._done_above: set[int] = set()  # done jobs at or above ``_written`` (writers finish out of order)
        self._waiting: deque[tuple[int, Callable[[], None]]] = deque()
        self._pending: dict[Path, torch.Tensor] = {}  # host copies of CPU payloads no writer has finished
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._streams: dict[torch.device, Any] = {}
        self._inline_buffers = StatsBuffers()  # for the payloads ``submit`` writes itself
        self._threads = [threading.Thread(target=self._run, name=f"tracediff-writer-{i}", daemon=True)
                         for i in range(writers)]
        for thread in self._threads:
            thread.start()

    @property
    def options(self) -> dict[str, int]:
        """What the capture's metadata states about the pipeline."""
        return {"writers": self.writers, "pool_bytes": self.pool.capacity, "peak_pool_bytes": self.pool.peak}

    @property
    def measures(self) -> bool:
        """True when ``submit``'s ``measure`` runs on a writer thread, off the forward's path."""
        return self.writers > 0

    def submit(self, path: Path, tensor: torch.Tensor, measure: Measure | None = None) -> int:
        """Write ``tensor`` to ``path`` (now or on a writer thread); returns its payload bytes.

        ``measure``, when given, is called with the tensor's host copy before
        the file is written (here, for a payload written here). Raises the
        first write error of any earlier payload, or this one's when it is
        written here.
        """
        self._raise_error()
        nbytes = tensor.numel() * tensor.element_size()
        if not self.writers or nbytes == 0 or nbytes > self.pool.capacity:
            if measure is not None:
                measure(tensor, self._inline_buffers)
            return self._write_now(path, tensor)
        buffer = self.pool.acquire(nbytes, abandon=lambda: self.error is not None)
        if buffer is None:
            self._raise_error()
        assert buffer is not None
        view = buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
        done, source = None, None
        if tensor.device.type == "cuda":
            done, source = self._copy_from_cuda(view, tensor), tensor
        else:
            view.copy_(tensor)
        with self._lock:
            seq, self._submitted = self._submitted, self._submitted + 1
            if done is None:
                self._pending[path] = view
        self._queue.put(_Job(path, view, buffer, done, source, seq, measure))
        return nbytes

    def pending_copy(self, path: Path) -> torch.Tensor | None:
        """The host copy of the CPU payload submitted for ``path`` while no writer has finished it, else None
        (its file is then as complete as it will be).

        Its bytes are the payload's for as long as the caller submits nothing: a buffer a writer gives back is
        handed out again only by ``submit``, on the capture's own thread.
        """
        with self._lock:
            return self._pending.get(path)

    def _copy_from_cuda(self, view: torch.Tensor, tensor: torch.Tensor) -> Any:
        """A non-blocking copy on a side stream, ordered after the producer and before the forward's next write."""
        device = tensor.device
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device=device)
        producer = torch.cuda.current_stream(device)
        stream.wait_stream(producer)
        with torch.cuda.stream(stream):
            view.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        producer.wait_event(done)  # a later in-place write to the tensor runs after its copy
        return done

    def _write_now(self, path: Path, tensor: torch.Tensor) -> int:
        written = self._write(path, tensor)
        with self._lock:
            self.files += 1
            self.payload_bytes += written
        return written

    def _run(self) -> None:
        buffers = StatsBuffers()  # this thread's own: buffers are not shared between threads
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                if job.done is not None:
                    job.done.synchronize()
                job.source = None
                if job.measure is not None:  # also behind a failed write: the entry stays complete
                    job.measure(job.view, buffers)
                if self.error is None:
                    self._write_now(job.path, job.view)
            except TracediffError as e:
                self._fail(e)
            except Exception as e:  # noqa: BLE001 - reported as the capture's failure, never lost
                self._fail(OutputDirError(f"{job.path}: could not write payload: {type(e).__name__}: {e}"))
            finally:
                with self._lock:
                    self._pending.pop(job.path, None)
                self.pool.release(job.buffer)
                self._job_done(job.seq)

    def after_written(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once every payload submitted so far is on disk: now when none is pending.

        It runs on the writer thread that finishes the last of them, and not at
        all when a write has failed: what it vouches for is then not on disk.
        """
        with self._lock:
            if self._written < self._submitted:
                self._waiting.append((self._submitted, callback))
                return
        if self.error is None:
            callback()

    def _job_done(self, seq: int) -> None:
        with self._lock:
            self._done_above.add(seq)
            while self._written in self._done_above:
                self._done_above.remove(self._written)
                self._written += 1
            ready = []
            while self._waiting and self._waiting[0][0] <= self._written:
                ready.append(self._waiting.popleft()[1])
        if self.error is None:
            for callback in ready:
                callback()

    def _fail(self, error: TracediffError) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
        self.pool.wake()

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Wait until every queued payload is written, stop the writers, and raise the first write error."""
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._raise_error()


def payload_pipeline(tensors: str, writers: int | None, pool_mb: int) -> PayloadPipeline | None:
    """The pipeline of a capture: one for ``tensors="full"``, with ``default_writers()`` unless given."""
    check_pipeline_options(writers, pool_mb)
    if tensors != "full":
        return None
    return PayloadPipeline(writers=default_writers() if writers is None else writers, pool_bytes=pool_mb << 20)


def check_pipeline_options(writers: int | None, pool_mb: int) -> None:
    """Refuse a negative or non-integer ``writers`` or ``pool_mb`` (UsageError)."""
    if writers is not None and (isinstance(writers, bool) or not isinstance(writers, int) or writers < 0):
        raise UsageError(f"writers={writers!r}: expected a number of threads, 0 or more")
    if isinstance(pool_mb, bool) or not isinstance(pool_mb, int) or pool_mb < 0:
        raise UsageError(f"pool_mb={pool_mb!r}: expected a size in MiB, 0 or more")


def close_pipeline(recorder: Any, options: dict[str, Any]) -> None:
    """Read back pending device statistics and wait for the payloads; an error becomes the capture's failure."""
    encoder = recorder.encoder
    try:
        encoder.resolve_stats()
    except Exception as e:  # noqa: BLE001 - the trace is still written, marked incomplete
        if recorder.failure is None:
            recorder.failure = TracediffError(f"could not read back statistics: {type(e).__name__}: {e}")
    pipeline: PayloadPipeline | None = encoder.pipeline
    if pipeline is None:
        return
    try:
        pipeline.close()
    except TracediffError as e:
        if recorder.failure is None:
            recorder.failure = e
    encoder.files, encoder.payload_bytes = pipeline.files, pipeline.payload_bytes
    options["payload_pipeline"] = pipeline.options
