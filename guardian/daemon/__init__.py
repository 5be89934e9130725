"""The imperative shell: the loop that polls, decides through the pure core, acts, and serves what it saw.

``loop`` holds the ``Daemon`` (start, poll, reload, stop); ``wiring`` builds
the running parts from a config (at start and on reload); ``readers`` the
blocking inputs (NVML, the process scan) off the loop; ``observe`` the events
and counters for what a poll saw and decided; ``persistence`` the policy
state on disk; ``children`` what a starting guardian does to the engines it
finds; ``http_api`` guardian's own listener and its authenticated API;
``views`` what the running parts look like from outside (/status, STATUS=).
"""

from guardian.daemon.loop import Daemon
from guardian.daemon.persistence import STATE_FILE
from guardian.daemon.wiring import StartupError, gateway_settings, launcher_for, record_header

__all__ = ["STATE_FILE", "Daemon", "StartupError", "gateway_settings", "launcher_for", "record_header"]
