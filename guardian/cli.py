"""The ``guardian`` command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from guardian import __version__
from guardian import config as cfg
from guardian import logs
from guardian.sim import scenarios

DEFAULT_CONFIG = Path("/etc/vllm-guardian/guardian.toml")
NO_ENGINES = ("no [[engines]]: guardian would watch nothing", 'add one: [[engines]] name = "llama-8b" url = "http://127.0.0.1:8000"')

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
        help="look for stepwise leaks in nvidia-smi CSV logs or guardian record files",
        description="Run the leak detector over logs: nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total"
        "[,utilization.gpu] --format=csv[,noheader][,nounits] -l 1 output, or files from guardian run --record. "
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    if getattr(args, "plot", None):
        from guardian.plotting import PlotUnavailable, check

        try:
            check()
        except PlotUnavailable as exc:
            print(f"guardian {args.command}: {exc}", file=sys.stderr)
            return 2
    try:
        return {
            "run": _run,
            "check-config": _check_config,
            "demo": _demo,
            "probe": _probe,
            "analyze": _analyze,
            "replay": _replay,
            "breaker": _breaker,
            "ack": _ack,
            "status": _status,
            "alerts": _alerts,
            "test-alert": _test_alert,
            "tune": _tune,
            "report": _report,
            "sim": _sim,
        }[args.command](args)
    except KeyboardInterrupt:
        return 130


def _load_or_exit(path: Path) -> cfg.Config:
    try:
        return cfg.load(path)
    except cfg.ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(cfg.EXIT_CONFIG) from None


def _run(args: argparse.Namespace) -> int:
    config = _load_or_exit(args.config)
    logs.configure(config.guardian.log_format, config.guardian.log_level)
    from guardian.daemon import Daemon, StartupError
    from guardian.record import SampleRecorder

    if args.record_max_mb <= 0 or args.record_keep < 0:
        print("guardian run: --record-max-mb must be above 0 and --record-keep at least 0", file=sys.stderr)
        return 2
    if not config.engines:
        print(f"guardian run: {args.config}: engines: {NO_ENGINES[0]}\n    fix: {NO_ENGINES[1]}", file=sys.stderr)
        return 2
    record = SampleRecorder(args.record, int(args.record_max_mb * 2**20), args.record_keep) if args.record else None
    try:
        on_terminal = sys.stderr if sys.stderr.isatty() else None  # under systemd the journal has the JSON log
        asyncio.run(Daemon(config, args.config, record=record, dry_run=args.dry_run, summary_to=on_terminal).run())
    except StartupError as exc:
        print(f"guardian: {exc}", file=sys.stderr)
        return 1
    return 0


def _check_config(args: argparse.Namespace) -> int:
    config = _load_or_exit(args.path)
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
    for note in config.warnings():
        print(f"warning: {note}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.engines < 1 or args.interval <= 0:
        print("guardian demo: --engines must be at least 1 and --interval above 0", file=sys.stderr)
        return 2
    logs.configure("console", "info")
    from guardian.daemon import StartupError
    from guardian.demo import run_demo

    duration = args.duration if args.duration is not None else scenarios.get(args.scenario).demo_seconds
    try:
        return asyncio.run(
            run_demo(args.scenario, duration, args.port, args.engines, args.seed, args.interval, record=args.record)
        )
    except StartupError as exc:
        print(f"guardian demo: {str(exc).replace('(guardian.listen)', '(--port)')}", file=sys.stderr)
        return 1


def _report(args: argparse.Namespace) -> int:
    from guardian import replay, report
    from guardian.plotting import PlotUnavailable

    if args.hours is not None and args.hours <= 0:
        print("guardian report: --hours must be above 0", file=sys.stderr)
        return 2
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        print(f"guardian report: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    override = _load_or_exit(args.config) if args.config else None
    try:
        header, records, problems = replay.read(args.files)
        config = replay.config_from(header, override)
        timeline = report.build(config, header, records, args.hours)
    except (replay.ReplayError, report.ReportError) as exc:
        print(f"guardian report: {exc}", file=sys.stderr)
        return 2
    for problem in problems[:20]:
        print(f"skipped: {problem}", file=sys.stderr)
    print(report.render(timeline, config, ", ".join(str(f) for f in args.files)))
    if args.plot:
        try:
            for path in report.plot(timeline, config, args.plot):
                print(f"plot: {path}")
        except PlotUnavailable as exc:
            print(f"guardian report: {exc}", file=sys.stderr)
            return 2
    return 0


def _tune(args: argparse.Namespace) -> int:
    from guardian import tune
    from guardian.plotting import PlotUnavailable

    if args.config is None and args.engine != "sim":
        args.config = DEFAULT_CONFIG
    config = _load_or_exit(args.config) if args.config is not None else cfg.Config()
    logs.configure("console", "warning")
    t = config.tune
    speculative = dict(config.tuner.speculative_config) if config.tuner and config.tuner.speculative_config else None
    slo = args.slo_ms / 1000 if args.slo_ms else (config.tuner.slo.target_seconds if config.tuner else 0.2)
    section = next((e for e in config.engines if e.name == args.engine), None)
    if section is None and args.engine != "sim":
        print(f"guardian tune: no engine {args.engine!r} in {args.config}", file=sys.stderr)
        return 2
    if section is not None and section.restart is None:
        print(f"guardian tune: engine {args.engine!r} has no [engines.restart]: guardian cannot restart it per point", file=sys.stderr)
        return 2
    if (args.seconds is not None and args.seconds <= 0) or (args.rates and min(args.rates) <= 0) or (args.slo_ms is not None and args.slo_ms <= 0):
        print("guardian tune: --seconds, --rates and --slo-ms must be above 0", file=sys.stderr)
        return 2
    backend = section.restart.attention_backend if section and section.restart else "flash_attn"
    try:
        points = tune.grid(args.block_sizes or t.block_sizes, args.max_num_seqs or t.max_num_seqs,
                           [s == "on" for s in args.speculation] if args.speculation else t.speculation, backend, speculative)  # fmt: skip
    except tune.TuneError as exc:
        print(f"guardian tune: {exc}", file=sys.stderr)
        return 2
    reqs = tune.requests(t.requests, t.seed, t.prompt_tokens_median, t.prompt_tokens_sigma, t.prompt_tokens_max,
                         t.output_tokens_median, t.output_tokens_sigma, t.output_tokens_max)  # fmt: skip
    # without a config (the simulator) the state directory may not be ours: the results go next to the caller
    results = args.results or (config.guardian.state_dir if args.config else Path.cwd()) / f"tune-{args.engine}.jsonl"
    try:
        found = asyncio.run(_tune_engine(config, section, points, reqs, args.rates or t.rates, args.seconds or t.seconds_per_rate,
                                         slo, t.seed, speculative, results))  # fmt: skip
    except (tune.TuneError, OSError) as exc:
        print(f"guardian tune: {exc}", file=sys.stderr)
        return 2
    chosen = tune.best(found, slo)
    print()
    print(tune.table(found, slo, chosen))
    print()
    if chosen is None:
        print(f"no point met the SLO (P99 TTFT <= {slo * 1000:g} ms with nothing failed): try lower rates or a larger GPU")
    else:
        point = next(p for p in points if p.key == chosen.point)
        print(f"best: {point}: {chosen.requests_per_second:.2f} req/s finished ({chosen.rate:g} req/s offered), "
              f"P99 TTFT {chosen.p99_ttft_seconds * 1000:.0f} ms (SLO {slo * 1000:g} ms), "  # type: ignore[operator]
              f"{chosen.tokens_per_second:.0f} tok/s")  # fmt: skip
        print(f"  engine arguments: --block-size {point.block_size} --max-num-seqs {point.max_num_seqs}"
              + (" --speculative-config '" + json.dumps(speculative, separators=(",", ":")) + "'" if point.speculation else ""))
    print(f"results: {results}")
    if args.plot:
        try:
            tune.plot(found, slo, args.plot)
        except PlotUnavailable as exc:
            print(f"guardian tune: {exc}", file=sys.stderr)
            return 2
        print(f"plot: {args.plot}")
    return 0 if chosen is not None else 1


async def _tune_engine(config: cfg.Config, section: cfg.EngineSection | None, points: list, reqs: list, rates: list[float],  # type: ignore[type-arg]
                       seconds: float, slo: float, seed: int, speculative: dict | None, results: Path) -> list:  # type: ignore[type-arg]  # fmt: skip
    """The search against a configured engine (its launcher), or against a simulated one started here."""
    import aiohttp

    from guardian import tune
    from guardian.actions.gateway import NoGateway
    from guardian.actions.restart import DrainedRestart
    from guardian.actions.vllm_admin import VllmAdmin
    from guardian.daemon import launcher_for
    from guardian.sim.engine import EngineModel
    from guardian.sim.launcher import SimLauncher
    from guardian.sim.server import SimServer
    from guardian.sources.vllm import VllmScraper

    server = None
    if section is None:  # --engine sim
        server = SimServer(EngineModel(seed=seed), dev_mode=True)
        await server.start()
        url, api_key, base, dev, backend = server.url, None, {}, True, "flash_attn"
        launcher: Any = SimLauncher(server, load_seconds=1.0, seed=seed)
    else:
        assert section.restart is not None
        url, api_key, dev, backend = section.url, section.read_api_key(), section.dev_mode, section.restart.attention_backend
        base = config.base_args(section)
        launcher = launcher_for(section, config.guardian.state_dir)
    try:
        async with aiohttp.ClientSession() as session:
            scraper = VllmScraper(section.name if section else "sim", url, session, 10.0, api_key)
            procedure = DrainedRestart(section.name if section else "sim", launcher, NoGateway(),
                                       VllmAdmin(url, session) if dev else None, scraper.health, scraper.load,
                                       config.actions.timeouts, backend)  # fmt: skip
            search = tune.Search(url, api_key, base, points, sorted(rates), seconds, reqs, slo, seed, speculative, results)
            found = await tune.run(search, procedure.run)
            if section is not None:
                print("restarting the engine with its own arguments again", flush=True)
                outcome = await procedure.run(base)
                if not outcome.ok:
                    print(f"guardian tune: the engine did not come back with its own arguments: {outcome.detail}", file=sys.stderr)
            return found
    finally:
        if server is not None:
            await server.stop()


def _probe(args: argparse.Namespace) -> int:
    from guardian.probe import probe, render_text

    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    if args.api_key_env and api_key is None:
        print(f"guardian probe: environment variable {args.api_key_env} is not set", file=sys.stderr)
        return 2
    try:
        cfg.EngineSection(name="probe", url=args.vllm)
    except Exception:
        print(f"guardian probe: {args.vllm!r} is not an http(s) base URL, e.g. http://127.0.0.1:8000", file=sys.stderr)
        return 2
    nvml_module = None
    if not args.no_nvml:
        import pynvml

        nvml_module = pynvml
    result = asyncio.run(probe(args.vllm, args.timeout, api_key, nvml_module))
    print(json.dumps(result, indent=2) if args.json else render_text(result))
    return 0 if result["up"] else 1


def _analyze(args: argparse.Namespace) -> int:
    import dataclasses

    from guardian import analyze

    if args.warmup < 0:
        print("guardian analyze: --warmup must be 0 or more", file=sys.stderr)
        return 2
    series, problems = analyze.read(args.files)
    for problem in problems[:50]:
        print(f"skipped: {problem}", file=sys.stderr)
    if len(problems) > 50:
        print(f"skipped: … and {len(problems) - 50} more rows", file=sys.stderr)
    if not series:
        print("guardian analyze: no usable memory readings in the input", file=sys.stderr)
        return 2
    from guardian.analysis.leak import LeakParams

    params = dataclasses.replace(LeakParams(), warmup_seconds=max(args.warmup, 1e-9))
    verdicts = analyze.analyze(series, params)
    print(json.dumps(analyze.to_json(verdicts), indent=2) if args.json else analyze.render(verdicts))
    if args.plot:
        try:
            analyze.plot(verdicts, args.plot)
        except analyze.InputError as exc:
            print(f"guardian analyze: {exc}", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 1 if any(v.leak for v in verdicts) else 0


def _replay(args: argparse.Namespace) -> int:
    from guardian import replay

    override = _load_or_exit(args.config) if args.config else None
    header, records, problems = replay.read(args.files)
    for problem in problems[:50]:
        print(f"skipped: {problem}", file=sys.stderr)
    try:
        config = replay.config_from(header, override)
        result = replay.replay(config, header, records, problems)
    except replay.ReplayError as exc:
        print(f"guardian replay: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for decision in result.decisions:
            print(json.dumps(decision.to_record()))
    else:
        print(replay.render(result))
    print(f"{result.samples} samples, {len(result.decisions)} decisions", file=sys.stderr)
    if override is not None:
        return 0
    difference = result.first_difference()
    if difference is None:
        print("identical to the decisions the live run recorded", file=sys.stderr)
        return 0
    print(f"differs from the live run: {difference}", file=sys.stderr)
    return 1


def _breaker(args: argparse.Namespace) -> int:
    if args.action == "force" and args.level is None:
        print("guardian breaker: force needs a level (0-3), e.g. guardian breaker force llama-8b 2", file=sys.stderr)
        return 2
    body = {"action": args.action, "who": args.who} | ({"level": args.level} if args.action == "force" else {})
    answer = _call_api("breaker", args.config, f"breaker/{args.engine}", body)
    if isinstance(answer, int):
        return answer
    pinned = f" (pinned by {answer['forced_by']})" if answer.get("forced") else " (the rules decide again)"
    print(f"{answer['engine']}: L{answer['level']}{pinned}" + (" [dry run]" if answer.get("dry_run") else ""))
    return 0


def _ack(args: argparse.Namespace) -> int:
    answer = _call_api("ack", args.config, "alerts/ack", {"key": args.key, "who": args.who})
    if isinstance(answer, int):
        return answer
    print(f"{answer['key']}: acknowledged by {answer['acknowledged_by']}; no more repeats or escalation")
    return 0


def _base_url(config: cfg.Config) -> str:
    """Where the running guardian of this config answers (a wildcard listen is reached on loopback)."""
    host, port = cfg.parse_listen(config.guardian.listen)
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def _status(args: argparse.Namespace) -> int:
    import time

    from guardian import status_view

    url = args.url or _base_url(_load_or_exit(args.config))
    while True:
        doc = _running_status("status", url)
        if doc is None and not args.watch:
            return 1
        if doc is not None:
            text = json.dumps(doc, indent=2) if args.json else status_view.render(doc)
            print(("\x1b[H\x1b[2J" if args.watch and sys.stdout.isatty() else "") + text, flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)


def _alerts(args: argparse.Namespace) -> int:
    from guardian import status_view

    doc = _running_status("alerts", args.url or _base_url(_load_or_exit(args.config)))
    if doc is None:
        return 1
    alerts = doc.get("alerts", [])
    print(json.dumps(alerts, indent=2) if args.json else status_view.render_alerts(alerts))
    return 0


def _running_status(command: str, url: str) -> dict[str, Any] | None:
    """The running guardian's /status; None, said on stderr, when it does not answer."""
    from guardian import status_view

    try:
        return status_view.fetch(url)
    except status_view.Unreachable as exc:
        print(f"guardian {command}: {exc}", file=sys.stderr)
        return None


def _call_api(command: str, config_path: Path, path: str, body: dict[str, object]) -> dict[str, Any] | int:
    """POST to the running guardian's API with the token from its config; an exit code when that fails."""
    import urllib.error
    import urllib.request

    config = _load_or_exit(config_path)
    try:
        token = config.guardian.read_api_token()
    except OSError as exc:
        print(f"guardian {command}: cannot read the API token: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if token is None:
        print(f"guardian {command}: {config_path} sets no guardian.api_token_file: the API is off", file=sys.stderr)
        return 2
    url = f"{_base_url(config)}/api/v1/{path}"
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        doc = json.loads(exc.read() or b"{}")
        extra = f" (firing: {', '.join(doc['firing']) or 'none'})" if "firing" in doc else ""
        print(f"guardian {command}: {url} answered {exc.code}: {doc.get('error', exc.reason)}{extra}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"guardian {command}: cannot reach guardian at {url}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 1


def _test_alert(args: argparse.Namespace) -> int:
    import socket
    from datetime import datetime, timezone

    from guardian.notify.sms import TwilioSender, mask, read_token
    from guardian.notify.sms_text import encode, fit

    config = _load_or_exit(args.config)
    sms = config.notify.sms
    if sms is None:
        print(f"guardian test-alert: {args.config} has no [notify.sms]", file=sys.stderr)
        return 2
    try:
        cfg.ContactSection(name="test", number=args.to)
    except Exception:
        print(f"guardian test-alert: {args.to!r} is not an E.164 number like +4915112345678", file=sys.stderr)
        return 2
    at = datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    body = fit([f"TEST from vllm-guardian on {socket.gethostname()}", f"at {at}", "no action needed"], sms.max_segments)
    encoded = encode(body)
    print(f"to {mask(args.to)}: {body!r} ({encoded.encoding}, {encoded.segments} segment{'s' if encoded.segments > 1 else ''})")
    if args.dry_run:
        return 0
    token = read_token()
    if token is None:
        print("guardian test-alert: no auth token: set $TWILIO_AUTH_TOKEN (or the twilio-auth-token credential)", file=sys.stderr)
        return 2
    sender = TwilioSender(sms.account_sid, token, sms.from_number, sms.messaging_service_sid, sms.status_callback,
                          sms.timeout_seconds, sms.api_url)  # fmt: skip
    sent = sender.send(args.to, body)
    print(f"{sent.result}: {sent.detail}")
    return 0 if sent.result == "sent" else 1


def _sim(args: argparse.Namespace) -> int:
    import dataclasses
    import subprocess

    from guardian.actions.engine_args import from_argv, validate
    from guardian.sim.cluster import SimCluster
    from guardian.sim.launcher import engine_params

    scenario = scenarios.get(args.scenario)
    argv = args.engine_args[1:] if args.engine_args[:1] == ["--"] else args.engine_args
    if argv:
        try:
            engine_args = from_argv(argv)
        except ValueError as exc:
            print(f"guardian sim: {exc}", file=sys.stderr)
            return 2
        problems = validate(engine_args)
        if problems:  # what vLLM itself would refuse to start with
            print("guardian sim: " + "; ".join(problems), file=sys.stderr)
            return 2
        scenario = dataclasses.replace(scenario, engine=engine_params(scenario.engine, engine_args))

    async def serve() -> None:
        core = None
        if argv:  # a stand-in for `vllm serve`: its engine core is a process of the same group, left behind by kill -9
            core = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(3600)", "guardian-sim-engine-core"])
        await asyncio.sleep(args.load_seconds)  # loading: nothing listens yet
        cluster = SimCluster(scenario, engines=args.engines, seed=args.seed)
        ports = [args.port + i for i in range(args.engines)] if args.port else None
        await cluster.start(ports=ports)
        for i, url in enumerate(cluster.urls):
            print(f"simulated vLLM server {i}: {url}", flush=True)
        if args.ports_file:
            args.ports_file.write_text("".join(url + "\n" for url in cluster.urls))
        try:
            if args.no_load:
                await asyncio.Event().wait()
            else:
                await cluster.run_load(None)
        finally:
            await cluster.stop()
            if core is not None:
                core.terminate()

    asyncio.run(serve())
    return 0
