"""A TCP proxy on loopback that cuts a connection after N bytes: a move's dropped link."""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

__all__ = ["CuttingProxy"]


class CuttingProxy:
    """Forwards 127.0.0.1:``port`` to ``target_port``.

    ``cut_after``: a connection that has carried this many bytes towards the target is
    closed (both ways), once; ``cut_replies_after``: likewise for bytes back from the
    target (those past it are not forwarded); later connections pass (None: never cut), unless
    ``refuse_after_cut``: then ``refuse`` is set by the cut. ``refuse``: new connections
    are closed at once while it is set. ``upstream``: bytes forwarded.
    """

    def __init__(self, target_port: int, cut_after: int | None = None) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
        self.cut_replies_after: int | None = None
        self.refuse = False
        self.refuse_after_cut = False
        self.cuts = 0
        self.upstream = 0
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._start(self._accept)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refuse:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._open += [client, upstream]
            link = {"sent": 0, "replied": 0}
            self._start(self._pump, client, upstream, link, True)
            self._start(self._pump, upstream, client, link, False)

    def _pump(
        self, src: socket.socket, dst: socket.socket, link: dict[str, int], counted: bool
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if counted:
                    with self._lock:
                        limit = self.cut_after
                        if limit is not None and link["sent"] + len(data) >= limit:
                            self.cut_after = None
                            self.cuts += 1
                            self.refuse = self.refuse or self.refuse_after_cut
                            cut = True
                        else:
                            cut = False
                        link["sent"] += len(data)
                        self.upstream += len(data)
                    if cut:
                        dst.sendall(data[: len(data) // 2])  # a body cut short mid-way
                        break
                elif (kept := self._reply_kept(link, len(data))) is not None:
                    dst.sendall(data[:kept])
                    break
                dst.sendall(data)
        except OSError:
            pass  # the other pump closed the link
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def _reply_kept(self, link: dict[str, int], n: int) -> int | None:
        """How much of ``n`` reply bytes still go before the cut; None: no cut."""
        with self._lock:
            limit, before = self.cut_replies_after, link["replied"]
            link["replied"] += n
            if limit is None or before + n <= limit:
                return None
            self.cut_replies_after = None
            self.cuts += 1
            return max(0, limit - before)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept()
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            for sock in self._open:
                with contextlib.suppress(OSError):
                    sock.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
