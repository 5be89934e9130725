"""systemd's notify protocol (sd_notify(3)): one datagram per message to ``$NOTIFY_SOCKET``.

Small enough to implement instead of depending on a library: an ``AF_UNIX``
datagram socket, ``@`` meaning the abstract namespace. Without
``NOTIFY_SOCKET`` (not started by systemd) every call is a no-op.
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        if address and address.startswith("@"):
            address = "\0" + address[1:]
        self._address = address or None
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *fields: str) -> bool:
        """Send ``KEY=value`` fields as one message; False when it could not be delivered."""
        if self._address is None:
            return False
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.sendto("\n".join(fields).encode(), self._address)
            return True
        except OSError:
            return False

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def watchdog(self, status: str | None = None) -> bool:
        return self.send("WATCHDOG=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> bool:
        return self.send("RELOADING=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval() -> float | None:
    """Half of ``WATCHDOG_USEC`` when systemd asks for pings to this process, else None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None
