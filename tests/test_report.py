"""guardian report's input handling (the report itself is checked on recorded simulator runs in test_tuner_sim)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guardian import cli


def test_report_refuses_missing_files_empty_records_and_bad_hours(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", str(tmp_path / "nope.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"kind": "header", "config": {}}) + "\n")
    assert cli.main(["report", str(empty)]) == 2
    assert "no sample records" in capsys.readouterr().err
    assert cli.main(["report", str(empty), "--hours", "0"]) == 2
    assert "--hours must be above 0" in capsys.readouterr().err
    headless = tmp_path / "headless.jsonl"
    headless.write_text('{"kind": "sample"}\n')
    assert cli.main(["report", str(headless)]) == 2
    assert "pass --config" in capsys.readouterr().err


def test_report_counts_the_time_an_operator_forced_a_level(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from guardian import config as cfg
    from guardian.daemon import record_header
    from guardian.pipeline import Pipeline
    from guardian.policy.response import Command
    from guardian.record import SampleRecorder
    from guardian.sample import EngineReading, NvmlReading, Sample

    config = cfg.Config(engines=[cfg.EngineSection(name="sim0", url="http://127.0.0.1:8000")])
    path = tmp_path / "record.jsonl"
    recorder = SampleRecorder(path)
    recorder.header = record_header(config, 64 * 2**30)
    pipeline = Pipeline(config, 64 * 2**30)
    wall0 = 1_800_000_000.0
    for k in range(100):
        if k == 50:  # halfway through, an operator pins L2
            recorder.write(pipeline.command(Command("force", "sim0", "alice", 2), float(k) - 0.5, wall0 + k - 0.5))
        sample = Sample(t=float(k), wall=wall0 + k, nvml=NvmlReading(), engines=(EngineReading("sim0", up=True, healthy=True),))
        recorder.write(sample)
        decision = pipeline.step(sample).decision
        if not decision.empty:
            recorder.write(decision)
    recorder.close()
    assert cli.main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "L0 50.0%" in out and "L2 50.0%" in out, out
