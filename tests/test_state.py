from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from guardian.state import StateFile


def test_saved_state_is_loaded_back(tmp_path: Path) -> None:
    state = StateFile(tmp_path / "sub" / "state.json")
    state.save({"level": 2, "restarts": [1.0, 2.0]})
    assert state.load().data == {"level": 2, "restarts": [1.0, 2.0]}
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["state.json"]  # no temp files left


def test_no_file_is_no_state(tmp_path: Path) -> None:
    loaded = StateFile(tmp_path / "state.json").load()
    assert loaded.data is None and loaded.quarantined is None


def test_truncated_file_is_quarantined_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    StateFile(path).save({"level": 3})
    path.write_bytes(path.read_bytes()[:10])
    loaded = StateFile(path).load()
    assert loaded.data is None and "not JSON" in loaded.reason
    assert loaded.quarantined is not None and loaded.quarantined.name.startswith("state.json.corrupt-")
    assert not path.exists() and loaded.quarantined.read_bytes().startswith(b'{"data"')


def test_wrong_shape_or_version_is_quarantined(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("[1, 2]")
    assert "not a guardian state document" in StateFile(path).load().reason
    path.write_text(json.dumps({"version": 9, "data": {}}))
    assert "version 9" in StateFile(path).load().reason


def test_kill_9_while_saving_leaves_the_old_or_the_new_state(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    writer = (
        "import sys; from pathlib import Path; from guardian.state import StateFile\n"
        "s = StateFile(Path(sys.argv[1]))\n"
        "i = 0\n"
        "while True:\n"
        "    s.save({'n': i, 'pad': 'x' * 20000}); i += 1\n"
    )
    for _ in range(5):
        proc = subprocess.Popen([sys.executable, "-c", writer, str(path)], env={**os.environ, "PYTHONPATH": str(Path.cwd())})
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        loaded = StateFile(path).load()
        assert loaded.quarantined is None and loaded.data is not None and loaded.data["pad"] == "x" * 20000


def test_content_the_reader_cannot_use_is_quarantined_too(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    StateFile(path).save({"engines": {"a": {"level": "high"}}})

    def parse(data: dict) -> int:  # type: ignore[type-arg]
        return int(data["engines"]["a"]["level"])

    loaded = StateFile(path).load(parse)
    assert loaded.value is None and loaded.quarantined is not None and "unexpected content (ValueError" in loaded.reason
    StateFile(path).save({"engines": {"a": {"level": "2"}}})
    assert StateFile(path).load(parse).value == 2
