"""TensorBoardLogger's ``SummaryWriter``: torch's, with its event file written by the thread
that adds the events instead of a writer thread of its own.

tensorboard's ``EventFileWriter`` starts a thread per writer and hands it every record
through a queue: on this project's 2-core VM, starting it and waiting for its first flush
cost a fit about 1 ms, and each ``flush`` and ``close`` waits for it again
(benchmarks/fit_cost.py). The logger writes its scalars in batches (every 10 s, at ``save``
and ``finalize``), so the thread saves training nothing; and the records' checksums are
Python code that holds the GIL on whichever thread computes them. Here a record goes into
the file's buffer at once, and reaches the file at each ``flush``, when the buffer fills,
or at an ``add`` once ``flush_secs`` have passed since the last flush. The file, its name
and its records are the ones tensorboard writes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import socket
import threading
import time
from typing import Any

from ._disk import naming

_uids = itertools.count()


class EventFile:
    """What ``FileWriter.event_writer`` is: tensorboard's ``EventFileWriter``'s methods."""

    def __init__(
        self, logdir: str, max_queue_size: int = 10, flush_secs: float = 120, filename_suffix: str = ""
    ) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.summary.writer import event_file_writer
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._event = event_pb2.Event
        self._logdir = logdir
        os.makedirs(logdir, exist_ok=True)
        # tensorboard's name, with its process-wide counter: no two writers of this process share a file.
        counter = getattr(event_file_writer, "_global_uid", None)
        uid = counter.get() if counter is not None else next(_uids)
        name = "events.out.tfevents.%010d.%s.%s.%s" % (time.time(), socket.gethostname(), os.getpid(), uid)
        self._file = open(os.path.join(logdir, name + filename_suffix), "wb")  # noqa: SIM115 (closed by close())
        self._records = RecordWriter(self._file)
        self._flush_secs, self._flushed = flush_secs, time.monotonic()  # (max_queue_size: no queue to size)
        self._lock = threading.Lock()  # a user's add_* from another thread: whole records
        self._closed = False
        self.add_event(self._event(
            wall_time=time.time(), file_version="brain.Event:2",
            source_metadata=event_pb2.SourceMetadata(writer="tensorboard.summary.writer.event_file_writer"),
        ))
        self.flush()

    def get_logdir(self) -> str:
        return self._logdir

    def add_event(self, event: Any) -> None:
        if not isinstance(event, self._event):
            raise TypeError(f"Expected an event_pb2.Event proto, but got {type(event)}")
        data = event.SerializeToString()
        with self._lock:
            if self._closed:
                raise OSError("Writer is closed")
            with naming(self._file.name):  # a full buffer is written out here
                self._records.write(data)
            if time.monotonic() - self._flushed >= self._flush_secs:
                self._flush()

    def flush(self) -> None:
        with self._lock:
            if self._closed:
                raise OSError("Writer is closed")
            self._flush()

    def _flush(self) -> None:
        with naming(self._file.name):
            self._file.flush()
        self._flushed = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self._flush()
                finally:  # closed even when the disk is full: the records that did not fit are lost
                    with contextlib.suppress(OSError):
                        self._file.close()


@functools.lru_cache(maxsize=None)
def summary_writer_class(summary_writer: type) -> type:
    """``summary_writer`` (torch's ``SummaryWriter``, imported by the caller) with ``EventFile``
    as its event writer; the class itself where torch's file writer is not as expected."""
    from torch.utils.tensorboard import writer as torch_writer

    file_writer, event, session_log = (getattr(torch_writer, n, None) for n in ("FileWriter", "Event", "SessionLog"))
    if file_writer is None or event is None or session_log is None or not hasattr(summary_writer, "_get_file_writer"):
        return summary_writer

    class FileWriter(file_writer):  # torch's, whose __init__ only makes the event writer
        def __init__(
            self, log_dir: Any, max_queue: int = 10, flush_secs: float = 120, filename_suffix: str = ""
        ) -> None:
            self.event_writer = EventFile(str(log_dir), max_queue, flush_secs, filename_suffix)

    class SummaryWriter(summary_writer):
        __doc__ = summary_writer.__doc__

        def _get_file_writer(self) -> Any:
            """torch's: the FileWriter, made again after a ``close``, with ``purge_step``'s events first."""
            if self.all_writers is None or self.file_writer is None:
                self.file_writer = FileWriter(self.log_dir, self.max_queue, self.flush_secs, self.filename_suffix)
                self.all_writers = {self.file_writer.get_logdir(): self.file_writer}
                if self.purge_step is not None:
                    self.file_writer.add_event(event(step=self.purge_step, file_version="brain.Event:2"))
                    start = session_log(status=session_log.START)
                    self.file_writer.add_event(event(step=self.purge_step, session_log=start))
                    self.purge_step = None
            return self.file_writer

    return SummaryWriter
