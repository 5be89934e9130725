"""The ``guardian`` command line."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from guardian import __version__
from guardian.commands.common import DEFAULT_CONFIG
from guardian.sim import scenarios

DESCRIPTION = """\
vllm-guardian watches vLLM servers and the GPUs under them: NVML memory and
utilisation, vLLM's KV cache, queues and latency, the vLLM process tree. It
finds stepwise memory leaks, runs a three-level breaker per engine (gates,
cached-KV resets, drained restarts with safer arguments, pages), and serves
what it sees as Prometheus metrics and JSON on its own HTTP port.

Start with `guardian demo` (no GPU needed) or `guardian probe --vllm URL`.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="guardian", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"vllm-guardian {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the daemon with a config file", description="Run the daemon: poll, analyse, export. SIGHUP reloads the config; SIGTERM stops.")
    run.add_argument("--config", "-c", required=True, type=Path, metavar="PATH", help="TOML config (see systemd/guardian.toml)")
    run.add_argument("--record", type=Path, metavar="FILE", help="write every sample to FILE as JSON lines (for guardian analyze)")
    run.add_argument("--record-max-mb", type=float, default=256, metavar="MB", help="rotate the record file at this size (default: 256)")
    run.add_argument("--record-keep", type=int, default=3, metavar="N", help="rotated record files to keep (default: 3)")
    run.add_argument("--dry-run", action="store_true", help="decide and log every breaker action (event action_planned) but carry none out")

    check = sub.add_parser("check-config", help="validate a config file and exit", description="Validate a config file: exit 0 when valid, 2 with every problem listed when not.")
    check.add_argument("path", type=Path, metavar="PATH")

    demo = sub.add_parser(
        "demo",
        help="simulated vLLM servers + GPUs + load, watched by the real daemon",
        description="Start simulated vLLM servers and GPUs, drive load at them, and run the guardian daemon on them, "
        "all in this process on loopback ports. Scenarios: "
        + "; ".join(f"{s.name}: {s.description}" for s in scenarios.SCENARIOS.values()),
    )
    demo.add_argument("--scenario", default="steady", choices=sorted(scenarios.SCENARIOS), help="workload and faults (default: steady)")
    demo.add_argument("--duration", type=float, metavar="SECONDS", help="how long to run; 0 = until Ctrl-C (default: the scenario's, 60 or 90)")
    demo.add_argument("--record", type=Path, metavar="FILE", help="write every sample to FILE (JSON lines) for guardian analyze")
    demo.add_argument("--port", type=int, default=0, help="guardian's HTTP port (default: a free port)")
    demo.add_argument("--engines", type=int, default=1, help="simulated engines, one GPU each (default: 1)")
    demo.add_argument("--seed", type=int, default=0, help="seed for arrivals and lengths (default: 0)")
    demo.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="poll interval (default: 1)")

    probe = sub.add_parser("probe", help="scrape one vLLM server (and NVML) once and print what guardian sees", description="One scrape of a vLLM server's /metrics and /health, and one NVML read where a driver is present.")
    probe.add_argument("--vllm", required=True, metavar="URL", help="base URL of the vLLM server, e.g. http://127.0.0.1:8000")
    probe.add_argument("--json", action="store_true", help="print JSON instead of text")
    probe.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS", help="per request (default: 5)")
    probe.add_argument("--no-nvml", action="store_true", help="do not read NVML")
    probe.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the server's API key")

    analyze = sub.add_parser(
        "analyze",
        help="look for stepwise leaks in nvidia-smi logs or guardian record files",
        description="Run the leak detector over logs: nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total"
        "[,utilization.gpu] --format=csv[,noheader][,nounits] -l N output (the GPU named by index, uuid or pci.bus_id), "
        "plain nvidia-smi -l N output (its tables), or files from guardian run --record. "
        "Prints a verdict per GPU. Exit status: 0 no leak, 1 a leak, 2 nothing usable in the input.",
    )
    analyze.add_argument("files", nargs="+", type=Path, metavar="FILE")
    analyze.add_argument("--plot", type=Path, metavar="PNG", help="draw the memory curves with the steps marked (needs matplotlib)")
    analyze.add_argument("--json", action="store_true", help="print JSON instead of text")
    analyze.add_argument("--warmup", type=float, default=60.0, metavar="SECONDS", help="after a start, at least this long is the model load (default: 60); the load lasts until memory stops rising, however long that takes")

    replay = sub.add_parser(
        "replay",
        help="run the breaker policy offline over a record file and print its decisions",
        description="Feed the samples of guardian run --record files through the same policy the daemon runs and print "
        "the decision timeline (transitions and actions). With the parameters recorded in the file the decisions "
        "must equal the live run's, and replay says whether they do; --config tries other thresholds. "
        "Exit status: 0 done (and identical, without --config), 1 differs from the recorded decisions, 2 unusable input.",
    )
    replay.add_argument("files", nargs="+", type=Path, metavar="FILE", help="record files, oldest first (FILE.2 FILE.1 FILE)")
    replay.add_argument("--config", "-c", type=Path, metavar="PATH", help="decide with this config's parameters instead of the recorded ones")
    replay.add_argument("--json", action="store_true", help="print the decisions as JSON lines")

    brk = sub.add_parser(
        "breaker",
        help="force or clear a breaker level on a running guardian",
        description="Pin an engine's breaker at a level (force) or hand it back to the rules (clear), through the "
        "running guardian's HTTP API. Needs the API token (guardian.api_token_file). A level pinned because the "
        "restart budget ran out is released with clear.",
    )
    brk.add_argument("action", choices=["force", "clear"])
    brk.add_argument("engine", help="the engine's name, as in the config")
    brk.add_argument("level", nargs="?", type=int, choices=[0, 1, 2, 3], help="for force: the level to pin")
    _operator_args(brk)

    status = sub.add_parser(
        "status",
        help="the running guardian at a glance: engines, GPUs, gateway, alerts, last actions",
        description="Read a running guardian's /status and show it on one 80-column screen: each engine's phase, breaker "
        "level and why, restarts left, KV and P99 TTFT; the GPUs and suspected leaks; the gateway's queues and gates; "
        "firing alerts and who acknowledged them; the last actions. The address is the config's [guardian] listen.",
    )
    _reader_args(status)
    status.add_argument("--json", action="store_true", help="print /status as JSON instead")
    status.add_argument("--watch", type=float, metavar="SECONDS", help="redraw every SECONDS until Ctrl-C")

    alerts = sub.add_parser(
        "alerts",
        help="list the running guardian's alerts: firing first, who acknowledged them",
        description="List the alerts a running guardian tracks (its /status): severity, key, since when, firing or "
        "resolved, who acknowledged it, whether a message went out, and the text. Acknowledge one with guardian ack KEY.",
    )
    _reader_args(alerts)
    alerts.add_argument("--json", action="store_true", help="print them as JSON")

    ack = sub.add_parser(
        "ack",
        help="acknowledge a firing alert: no more repeats or escalation",
        description="Acknowledge a firing alert on a running guardian (through its HTTP API; needs the API token). "
        "The key is in every page: e.g. breaker/llama-8b.",
    )
    ack.add_argument("key", help="the alert's key, as the page shows it")
    _operator_args(ack)

    test_alert = sub.add_parser(
        "test-alert",
        help="send one test SMS through the configured Twilio account",
        description="Send one SMS to NUMBER with [notify.sms] from the config and the auth token from $TWILIO_AUTH_TOKEN "
        "(or the twilio-auth-token credential), and print Twilio's answer. --dry-run prints the text and sends nothing.",
    )
    test_alert.add_argument("--to", required=True, metavar="NUMBER", help="E.164 number, e.g. +4915112345678")
    _operator_args(test_alert, who=False)
    test_alert.add_argument("--dry-run", action="store_true", help="print the message, send nothing")

    report = sub.add_parser(
        "report", help="summarise the last hours of a record file (guardian run --record); --plot draws PNGs",
        description="Play a record file through guardian's pipeline and summarise the last N hours per GPU and engine: "
        "memory and leak steps, time at each breaker level, restarts, P99 against the SLO, throughput, GPU memory per "
        "1000 tokens, tokens per joule, the marginal checks of larger batches, and the tuner's moves.",
    )  # fmt: skip
    report.add_argument("files", nargs="+", type=Path, metavar="FILE", help="record files, oldest first (FILE.2 FILE.1 FILE)")
    report.add_argument("--hours", type=float, metavar="N", help="only the last N hours (default: the whole record)")
    report.add_argument("--config", "-c", type=Path, metavar="PATH", help="decide with this config instead of the record's header")
    report.add_argument("--plot", type=Path, metavar="DIR", help="write memory.png, breaker.png, p99.png and tuning.png here")
    tune = sub.add_parser(
        "tune", help="offline search for the best block size, batch and speculation before go-live",
        description="Restart the engine once per grid point (block size x max-num-seqs x speculation), send a fixed-seed "
        "request set at increasing rates, and print P99 TTFT and throughput per point and the best point inside the SLO. "
        "Results are appended to a file as they come, so an interrupted search resumes. The engine needs "
        "[engines.restart] in the config; --engine sim tunes an in-process simulated engine (no config needed). "
        "Exit 0 when a point meets the SLO, 1 when none does, 2 on bad input.",
    )  # fmt: skip
    tune.add_argument("--engine", required=True, help="the [[engines]] name to tune, or 'sim' for a simulated engine")
    tune.add_argument("--config", "-c", type=Path, metavar="PATH", help=f"guardian's config (default: {DEFAULT_CONFIG}; optional with --engine sim)")
    tune.add_argument("--block-sizes", type=int, nargs="+", metavar="N", help="grid: --block-size values (default: [tune] block_sizes)")
    tune.add_argument("--max-num-seqs", type=int, nargs="+", metavar="N", help="grid: --max-num-seqs values (default: [tune] max_num_seqs)")
    tune.add_argument("--speculation", choices=["off", "on"], nargs="+", help="grid: speculation off and/or on (default: off)")
    tune.add_argument("--rates", type=float, nargs="+", metavar="RPS", help="offered loads, climbed per point (default: [tune] rates)")
    tune.add_argument("--seconds", type=float, metavar="S", help="load per rate (default: [tune] seconds_per_rate)")
    tune.add_argument("--slo-ms", type=float, metavar="MS", help="P99 TTFT objective (default: [tuner.slo] target, else 200)")
    tune.add_argument("--results", type=Path, metavar="PATH",
                      help="results file, resumable (default: STATE_DIR/tune-ENGINE.jsonl; ./tune-sim.jsonl without --config)")  # fmt: skip
    tune.add_argument("--plot", type=Path, metavar="PNG", help="also draw P99 and throughput against load")
    sim = sub.add_parser("sim", help="serve simulated vLLM servers (to try guardian run/probe without a GPU)", description="Serve simulated vLLM 0.33 servers on loopback with optional load until Ctrl-C.")
    sim.add_argument("--port", type=int, default=8000, help="port of the first server; 0 = free ports (default: 8000)")
    sim.add_argument("--engines", type=int, default=1, help="servers, on consecutive ports (default: 1)")
    sim.add_argument("--scenario", default="steady", choices=sorted(scenarios.SCENARIOS))
    sim.add_argument("--no-load", action="store_true", help="serve without generating load")
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--ports-file", type=Path, metavar="PATH", help="write the servers' URLs here, one per line, once listening")
    sim.add_argument("--load-seconds", type=float, default=0.0, metavar="S",
                     help="refuse connections this long before listening, as vLLM does while it loads its model (default: 0)")
    sim.add_argument("engine_args", nargs=argparse.REMAINDER, metavar="-- VLLM_ARGS",
                     help="after --: vLLM engine arguments the simulated engines start with (--max-num-seqs 16 --block-size 32 "
                          "--gpu-memory-utilization 0.8 --kv-cache-dtype fp8 --speculative-config JSON): a stand-in for "
                          "`vllm serve` under guardian's child launcher")  # fmt: skip
    return parser


def _operator_args(parser: argparse.ArgumentParser, who: bool = True) -> None:
    """--config (where guardian listens, its token file, its Twilio account) and --who, for the commands an operator types."""
    parser.add_argument("--config", "-c", type=Path, default=DEFAULT_CONFIG, metavar="PATH",
                        help=f"guardian's config: where it listens, the token file (default: {DEFAULT_CONFIG})")  # fmt: skip
    if who:
        parser.add_argument("--who", default=os.environ.get("USER", "operator"), help="your name, for the log (default: $USER)")


def _reader_args(parser: argparse.ArgumentParser) -> None:
    """Where the running guardian answers, for the commands that read its /status: --config (its listen) or --url."""
    _operator_args(parser, who=False)
    parser.add_argument("--url", metavar="URL", help="guardian's HTTP address instead, e.g. http://127.0.0.1:9400")


# each command's module under guardian/commands and the function there; imported only when that command runs
COMMANDS = {
    "run": ("run", "main"),
    "check-config": ("run", "check_config"),
    "demo": ("demo", "main"),
    "probe": ("probe", "main"),
    "analyze": ("analyze", "main"),
    "replay": ("replay", "main"),
    "breaker": ("control", "breaker"),
    "ack": ("control", "ack"),
    "status": ("status_view", "status"),
    "alerts": ("status_view", "alerts"),
    "test-alert": ("alert_test", "main"),
    "tune": ("tune", "main"),
    "report": ("report", "main"),
    "sim": ("sim", "main"),
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    if getattr(args, "plot", None):
        from guardian.commands.plotting import PlotUnavailable, check

        try:
            check()
        except PlotUnavailable as exc:
            print(f"guardian {args.command}: {exc}", file=sys.stderr)
            return 2
    module, function = COMMANDS[args.command]
    try:
        return getattr(importlib.import_module(f"guardian.commands.{module}"), function)(args)  # type: ignore[no-any-return]
    except KeyboardInterrupt:
        return 130
