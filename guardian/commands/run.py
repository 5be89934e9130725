"""``guardian run`` and ``guardian check-config``: the daemon itself, and the config it would run with."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, Coroutine, TypeVar

from guardian import config as cfg
from guardian import logs
from guardian.commands.common import load_or_exit
from guardian.daemon import Daemon, StartupError
from guardian.record import SampleRecorder

T = TypeVar("T")

NO_ENGINES = ("no [[engines]]: guardian would watch nothing", 'add one: [[engines]] name = "llama-8b" url = "http://127.0.0.1:8000"')


def main(args: argparse.Namespace) -> int:
    config = load_or_exit(args.config)
    logs.configure(config.guardian.log_format, config.guardian.log_level)

    if args.record_max_mb <= 0 or args.record_keep < 0:
        print("guardian run: --record-max-mb must be above 0 and --record-keep at least 0", file=sys.stderr)
        return 2
    if not config.engines:
        print(f"guardian run: {args.config}: engines: {NO_ENGINES[0]}\n    fix: {NO_ENGINES[1]}", file=sys.stderr)
        return 2
    record = SampleRecorder(args.record, int(args.record_max_mb * 2**20), args.record_keep) if args.record else None
    try:
        on_terminal = sys.stderr if sys.stderr.isatty() else None  # under systemd the journal has the JSON log
        run_loop(Daemon(config, args.config, record=record, dry_run=args.dry_run, summary_to=on_terminal).run())
    except StartupError as exc:
        print(f"guardian: {exc}", file=sys.stderr)
        return 1
    return 0


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """On uvloop where it is installed (Linux): the gateway's relay and the poll's HTTP spend a third less per event."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)  # type: ignore[no-any-return]


def check_config(args: argparse.Namespace) -> int:
    config = load_or_exit(args.path)
    problems = [("engines", *NO_ENGINES)] if not config.engines else []
    for key, path in config.secret_files():
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            problems.append((key, f"{path} does not exist", "create it (root-owned, mode 0600 or 0640 for guardian's group)"))
            continue
        except OSError as exc:
            problems.append((key, f"{path} cannot be read: {exc.strerror}", "give guardian's user read access"))
            continue
        if mode & 0o004:
            problems.append((key, f"{path} is readable by every user on the host", f"chmod o-rwx {path}"))
    if problems:
        print(f"{args.path}: {len(problems)} problem{'s' if len(problems) != 1 else ''}")
        for key, what, fix in problems:
            print(f"{args.path}: {key}: {what}\n    fix: {fix}")
        return 2
    g = config.guardian
    print(
        f"{args.path}: OK: {len(config.engines)} engine(s), GPUs {config.gpus.select}, "
        f"poll every {g.poll_interval_seconds:g}s, listening on {g.listen}"
    )
    print(f"{args.path}: {_tuner_line(config)}")
    for note in config.warnings():
        print(f"warning: {note}")
    return 0


def _tuner_line(config: cfg.Config) -> str:
    """What the tuner will do, said at check time: it is on by default and may restart engines, which an upgrade should not hide."""
    tuned = [e for e in config.engines if config.tuned(e.name)]
    if not tuned:
        return "tuner off"
    restarts = [e.name for e in tuned if e.restart is not None]
    may = (f"; it may restart {', '.join(restarts)} to tune them (at most {config.tuner.restarts_per_day} a day, inside "
           "[tuner] windows)" if restarts else "; it restarts none of them (no [engines.restart])")  # fmt: skip
    may += "; it sets the ceiling of the gateway's cap" if config.gateway is not None else ""
    return f"tuner on for {', '.join(e.name for e in tuned)} (the default; [tuner] enabled = false turns it off){may}"
