"""The copies a TorchState commit keeps of the model's and the optimizer's
state (gyre.torch.elastic): made in place into the previous commit's tensors
where the structure allows (_copy_into), and for the tensors the commit
defers, in the background (_CopyJob: gyre's native copy thread for plain
CPU tensors, else torch on one worker thread)."""

import copy
import queue
import threading
from typing import Any, Callable, List, Optional

import torch

from gyre import _gyre


def _plain_cpu(t: torch.Tensor) -> bool:
    return t.is_cpu and t.is_contiguous() and not t.is_conj() and not t.is_neg()


class _CopyJob:
    """One commit's background copy: ``pairs`` of (dst, src, version, name).
    Contiguous CPU tensors are copied by gyre's extension on a thread of its
    own that never takes the GIL (``_gyre.BackgroundCopy``); anything else
    (or a test's ``gate``) by torch on the worker thread below."""

    def __init__(self, pairs: List[tuple], gate: Optional[Callable[[], None]]) -> None:
        # First in the instance's dict, so released first: a job dropped
        # without wait() joins its copy thread before the tensors can go.
        self._native = None
        self.pairs = pairs
        self.gate = gate
        self.error: Optional[BaseException] = None
        self.done = threading.Event()
        # (_copy_into made every dst a strided tensor of its src's shape and
        # dtype.)
        if gate is None and all(_plain_cpu(d) and _plain_cpu(s) for d, s, _v, _n in pairs):
            self._native = _gyre.BackgroundCopy(
                [(d.data_ptr(), s.data_ptr(), d.numel() * d.element_size())
                 for d, s, _v, _n in pairs])
        else:
            _copy_worker.submit(self)

    def wait(self) -> None:
        if self._native is not None:
            self._native.wait()  # without the GIL
        else:
            self.done.wait()

    def __del__(self) -> None:
        # The copy thread writes into tensors this job keeps alive.
        if getattr(self, "_native", None) is not None:
            self._native.wait()

    def run(self) -> None:
        try:
            if self.gate is not None:
                self.gate()
            dsts = [d for d, _s, _v, _n in self.pairs]
            srcs = [s for _d, s, _v, _n in self.pairs]
            with torch.no_grad():
                # One call for every tensor: the thread gives up the GIL for
                # the whole copy, not once per tensor.
                torch._foreach_copy_(dsts, srcs)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            self.error = e
        finally:
            self.done.set()


class _CopyWorker:
    """The thread that runs the background copies, one at a time (started at
    the first; a thread started per commit would cost its start-up on the
    caller's thread)."""

    def __init__(self) -> None:
        self._jobs: "queue.SimpleQueue[_CopyJob]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def submit(self, job: _CopyJob) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="gyre-elastic-commit",
                                                daemon=True)
                self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            self._jobs.get().run()


_copy_worker = _CopyWorker()


def _copy_into(dst: Any, src: Any, deferred: Optional[List[tuple]] = None,
               background: Optional[set] = None, path: str = "") -> Any:
    """A copy of ``src`` (nested dicts, lists and tuples of tensors and other
    values), reusing ``dst``'s tensors where ``dst`` has the same structure
    and the tensor the same shape, dtype and device (``copy_`` in place);
    anything else is copied anew. A tensor whose id is in ``background`` is
    not copied here: its destination is made ready and ``(dst, src,
    src._version, path)`` appended to ``deferred``."""
    if isinstance(src, torch.Tensor):
        later = deferred is not None and background is not None and id(src) in background
        src_data = src.detach()
        if (isinstance(dst, torch.Tensor) and dst is not src and dst.shape == src.shape
                and dst.dtype == src.dtype and dst.device == src.device
                and dst.layout == src.layout == torch.strided):
            out = dst
        elif later and src.layout == torch.strided:
            out = torch.empty_like(src_data, memory_format=torch.preserve_format)
        else:
            return src_data.clone()
        if later:
            deferred.append((out, src_data, src._version, path))
        else:
            with torch.no_grad():
                out.copy_(src_data)
        return out
    if isinstance(src, dict):
        old = dst if isinstance(dst, dict) else {}
        out = type(src)() if type(src) is not dict else {}
        for k, v in src.items():
            out[k] = _copy_into(old.get(k), v, deferred, background, f"{path}[{k!r}]")
        if hasattr(src, "_metadata"):  # a module's state_dict (an OrderedDict)
            out._metadata = copy.deepcopy(src._metadata)
        return out
    if isinstance(src, (list, tuple)) and type(src) in (list, tuple):
        old = dst if isinstance(dst, (list, tuple)) and len(dst) == len(src) else [None] * len(src)
        return type(src)(_copy_into(d, v, deferred, background, f"{path}[{i}]")
                         for i, (d, v) in enumerate(zip(old, src)))
    return copy.deepcopy(src)
