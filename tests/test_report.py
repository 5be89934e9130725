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
