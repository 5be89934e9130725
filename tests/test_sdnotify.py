from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from guardian.sdnotify import Notifier, watchdog_interval


def test_ready_and_watchdog_arrive_as_sd_notify_datagrams(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "n"))
    sock.settimeout(1)
    notifier = Notifier(address=str(tmp_path / "n"))
    assert notifier.ready("3 engines up")
    assert sock.recv(1024) == b"READY=1\nSTATUS=3 engines up"
    assert notifier.watchdog()
    assert sock.recv(1024) == b"WATCHDOG=1"
    assert notifier.stopping()
    assert sock.recv(1024) == b"STOPPING=1"
    sock.close()


def test_abstract_namespace_socket_is_supported() -> None:
    name = f"guardian-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(1)
    assert Notifier(address="@" + name).ready("ok")
    assert sock.recv(1024) == b"READY=1\nSTATUS=ok"
    sock.close()


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled and not notifier.ready("x")


def test_vanished_socket_is_not_an_error(tmp_path: Path) -> None:
    assert Notifier(address=str(tmp_path / "gone")).watchdog() is False


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 5.0
    monkeypatch.setenv("WATCHDOG_PID", "1")
    assert watchdog_interval() is None
