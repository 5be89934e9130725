"""guardian tune: the grid, the verdict, the results file, and a real search against a simulated engine."""

from __future__ import annotations

import json
import re
import os
import signal
from dataclasses import asdict
from pathlib import Path

import pytest

from guardian import cli
from guardian.commands import tune_search as tune
from guardian.commands.tune_search import Measurement, Point


def _m(point: str, rate: float, p99: float | None, rps: float, failed: int = 0, error: str | None = None) -> Measurement:
    return Measurement(point, rate, 10, 10, 10 - failed, failed, p99, p99, rps, rps * 100, error)


def test_the_grid_refuses_a_block_size_the_backend_refuses_before_anything_restarts() -> None:
    with pytest.raises(tune.TuneError, match="block size 24 is refused by vLLM's flash_attn backend"):
        tune.grid([16, 24], [8], [False], "flash_attn", None)
    with pytest.raises(tune.TuneError, match="16, 32 or 64"):
        tune.grid([128], [8], [False], "flashinfer", None)
    assert [p.key for p in tune.grid([32, 16], [8, 4], [False], "flash_attn", None)] == [
        "block16-seqs4-specoff", "block16-seqs8-specoff", "block32-seqs4-specoff", "block32-seqs8-specoff"]  # fmt: skip


def test_speculation_on_needs_a_speculative_config() -> None:
    with pytest.raises(tune.TuneError, match="speculative_config"):
        tune.grid([16], [8], [True], "flash_attn", None)
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    on, off = Point(16, 8, True), Point(16, 8, False)
    assert on.args(spec)["speculative-config"] == spec and off.args(spec)["speculative-config"] is None


def test_the_request_set_is_the_same_for_the_same_seed_and_bounded() -> None:
    a = tune.requests(100, 7, 512, 0.6, 2048, 128, 0.5, 256)
    assert a == tune.requests(100, 7, 512, 0.6, 2048, 128, 0.5, 256)
    assert a != tune.requests(100, 8, 512, 0.6, 2048, 128, 0.5, 256)
    assert max(r.prompt_tokens for r in a) <= 2048 and max(r.max_tokens for r in a) <= 256


def test_best_is_the_most_throughput_inside_the_slo_with_nothing_failed() -> None:
    results = [
        _m("a", 2, 0.05, 2.0), _m("a", 4, 0.15, 3.9), _m("a", 8, 0.9, 5.0),  # 8 req/s misses the SLO
        _m("b", 2, 0.04, 2.0), _m("b", 4, 0.10, 4.0), _m("b", 8, 0.19, 6.0, failed=1),  # one failure disqualifies
        _m("c", 0, None, 0, error="refused: vLLM would refuse these arguments"),
    ]  # fmt: skip
    chosen = tune.best(results, 0.2)
    assert chosen is not None and (chosen.point, chosen.rate) == ("b", 4)
    text = tune.table(results, 0.2, chosen)
    assert "<- best" in text.splitlines()[5] and "not measured: refused" in text
    assert tune.best([_m("a", 2, 0.5, 2.0)], 0.2) is None


def test_a_damaged_results_file_is_refused_with_the_line(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    tune.append_result(path, _m("a", 2, 0.05, 2.0))
    with path.open("a") as f:
        f.write('{"point": "a"\n')
    with pytest.raises(tune.TuneError, match=r"r.jsonl:2: not a result line"):
        tune.load_results(path)


@pytest.mark.slow
def test_tune_against_the_simulator_prints_a_table_picks_a_point_inside_the_slo_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "tune.jsonl"
    argv = ["tune", "--engine", "sim", "--block-sizes", "16", "--max-num-seqs", "2", "16", "--rates", "1", "6",
            "--seconds", "3", "--results", str(results), "--plot", str(tmp_path / "tune.png")]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "[1/2] block 16, max-num-seqs 2, speculation off: restarting the engine" in out
    assert re.search(r"best: block 16, max-num-seqs 16, speculation off: [\d.]+ req/s finished \(6 req/s offered\)", out)
    assert "engine arguments: --block-size 16 --max-num-seqs 16" in out
    header, *lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert header["settings"]["seconds"] == 3  # what a resume is checked against
    small = [m for m in lines if m["point"] == "block16-seqs2-specoff"]
    assert small[-1]["p99_ttft_seconds"] > 0.2  # it missed the SLO at 6 req/s: the table says so
    assert (tmp_path / "tune.png").stat().st_size > 10_000
    # run again: everything is in the file, nothing is restarted or measured
    assert cli.main(argv[:-2]) == 0
    again = capsys.readouterr().out
    assert "2 already in" in again and "restarting" not in again and "<- best" in again


@pytest.mark.slow
def test_an_interrupted_search_measures_only_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "tune.jsonl"
    argv = ["tune", "--engine", "sim", "--block-sizes", "16", "--rates", "1", "6", "--seconds", "2", "--results", str(results)]
    cli.main([*argv, "--max-num-seqs", "2"])  # the first point, done before the interruption
    measured = len(results.read_text().splitlines())
    capsys.readouterr()
    cli.main([*argv, "--max-num-seqs", "2", "16"])
    out = capsys.readouterr().out
    assert "1 already in" in out and "[1/1] block 16, max-num-seqs 16" in out
    assert len(results.read_text().splitlines()) == measured + 2
    # the same file with other settings would mix numbers that do not compare: refused, with what differs
    assert cli.main([*argv[:-4], "--seconds", "3", "--results", str(results), "--max-num-seqs", "2", "16", "32"]) == 2
    assert "holds results measured with other settings (seconds)" in capsys.readouterr().err


def test_tune_with_an_engine_that_cannot_be_restarted_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "g.toml"
    config.write_text('[[engines]]\nname = "a"\nurl = "http://127.0.0.1:8000"\n')
    assert cli.main(["tune", "--engine", "a", "--config", str(config)]) == 2
    assert "has no [engines.restart]" in capsys.readouterr().err
    assert cli.main(["tune", "--engine", "b", "--config", str(config)]) == 2
    assert "no engine 'b'" in capsys.readouterr().err


def test_measurement_round_trips_through_the_results_file(tmp_path: Path) -> None:
    m = _m("a", 2, 0.05, 2.0)
    tune.append_result(tmp_path / "r.jsonl", m)
    assert tune.load_results(tmp_path / "r.jsonl") == [m] and asdict(m)["point"] == "a"


@pytest.mark.slow
def test_tune_restarts_a_configured_engine_per_point_and_gives_it_its_own_arguments_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real path: [engines.restart] with the child launcher, `guardian sim -- ARGS` standing in for `vllm serve`."""
    import sys

    import psutil

    from tests.helpers import free_port

    port = free_port()
    config = tmp_path / "guardian.toml"
    command = json.dumps([sys.executable, "-m", "guardian", "sim", "--port", str(port), "--no-load", "--"])
    config.write_text(f"""
[guardian]
state_dir = "{tmp_path}"
[[engines]]
name = "e1"
url = "http://127.0.0.1:{port}"
dev_mode = true
[engines.restart]
launcher = "child"
command = {command}
args = {{ max-num-seqs = 8 }}
[actions]
drain_timeout_seconds = 5
start_timeout_seconds = 60
""")
    argv = ["tune", "--engine", "e1", "--config", str(config), "--block-sizes", "16", "--max-num-seqs", "2", "16",
            "--rates", "6", "--seconds", "3"]  # fmt: skip
    try:
        assert cli.main(argv) == 0
        out = capsys.readouterr().out
        assert re.search(r"best: block 16, max-num-seqs 16, speculation off: [\d.]+ req/s finished \(6 req/s offered\)", out)
        assert "restarting the engine with its own arguments again" in out
        pid = json.loads((tmp_path / "e1.pid").read_text())["pid"]
        cmdline = psutil.Process(pid).cmdline()
        assert cmdline[cmdline.index("--max-num-seqs") + 1] == "8" and "--block-size" not in cmdline
        # each stand-in ran an "engine core" in its group, as vLLM does; every restart stopped the old group whole
        cores = [p for p in psutil.process_iter() if "guardian-sim-engine-core" in " ".join(p.cmdline())]
        assert len(cores) == 1 and os.getpgid(cores[0].pid) == pid
    finally:
        pid_file = tmp_path / "e1.pid"
        if pid_file.exists():
            try:
                os.killpg(json.loads(pid_file.read_text())["pid"], signal.SIGKILL)
            except (OSError, ValueError):
                pass


async def test_prompts_are_drawn_from_the_served_tokenizers_ids_and_fitted_to_the_models_length() -> None:
    import aiohttp

    from guardian.sim.engine import EngineModel
    from guardian.sim.server import SimServer

    server = SimServer(EngineModel(seed=1))
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            served = await tune.served_by(http, server.url, None)
    finally:
        await server.stop()
    assert served.model == server.engine.params.model_name
    assert served.token_ids and max(served.token_ids) < 20000  # what the tokenizer gives, not a blind range
    assert served.max_model_len == server.engine.params.max_model_len
    too_long = tune.Request(prompt_tokens=served.max_model_len, max_tokens=512)
    fitted = served.fit(too_long)
    assert fitted.prompt_tokens + fitted.max_tokens < served.max_model_len and fitted.max_tokens > 0
    assert served.fit(tune.Request(100, 10)) == tune.Request(100, 10)


def test_a_point_that_fails_says_why() -> None:
    assert tune._message('{"error": {"message": "token id 23999 is out of vocabulary", "code": 400}}') == \
        "token id 23999 is out of vocabulary"  # fmt: skip
    assert tune._message("<html>bad gateway</html>") == "<html>bad gateway</html>"


def test_the_tune_plot_marks_the_best_point_and_draws_the_slo_apart_from_the_series(tmp_path: Path) -> None:
    results = [_m("a", 1, 0.05, 1.0), _m("a", 2, 0.08, 1.9), _m("b", 1, 0.04, 1.0), _m("b", 2, 0.5, 1.2)]
    seen: list[object] = []
    tune.plot(results, 0.2, tmp_path / "tune.png", seen.append)
    (fig,) = seen
    lat = fig.axes[0]  # type: ignore[attr-defined]
    star = [line for line in lat.lines if line.get_marker() == "*"]
    assert len(star) == 1 and list(star[0].get_xdata()) == [2] and star[0].get_label() == "best: a"
    slo = [line for line in lat.lines if line.get_linestyle() == "--"]
    assert len(slo) == 1 and slo[0].get_color() == "black" and slo[0].get_label() == "SLO 200 ms"
    assert (tmp_path / "tune.png").stat().st_size > 10_000
