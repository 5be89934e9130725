"""The README's commands stay true: the install walk-through names files, paths and subcommands that exist."""

from __future__ import annotations

import re
from pathlib import Path

from guardian import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _block(heading: str) -> str:
    section = README[README.index(heading):]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]


def test_the_install_walk_through_uses_the_units_paths_and_real_subcommands() -> None:
    block = _block("## Install on a GPU host, from scratch")
    unit = (ROOT / "systemd" / "guardian.service").read_text()
    for path in re.findall(r"(?<![/\w])(systemd/[\w.-]+)", block):
        assert (ROOT / path).is_file(), path
    exec_start = re.search(r"^ExecStart=(\S+) run --config (\S+)$", unit, re.M)
    assert exec_start is not None
    binary, config = exec_start.groups()
    assert f"sudo python3 -m venv {binary.removesuffix('/bin/guardian')}" in block
    assert f"install -m 0640 -o root -g vllm-guardian systemd/guardian.toml {config}" in block
    assert "User=vllm-guardian" in unit and "useradd --system --user-group" in block and "vllm-guardian" in block
    for credential in re.findall(r"^LoadCredential=[\w-]+:(\S+)$", unit, re.M):
        assert credential in block, credential  # every credential file the unit loads is made in the walk-through
    commands = set(cli._parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    used = set(re.findall(r"/opt/vllm-guardian/bin/guardian ([a-z-]+)", block))
    assert used and used <= commands, used - commands


def test_every_guardian_subcommand_the_readme_shows_exists() -> None:
    commands = set(cli._parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    blocks = "\n".join(re.findall(r"```sh\n(.*?)```", README, re.S))
    code = re.sub(r"#.*", "", blocks) + "\n" + "\n".join(re.findall(r"`([^`\n]+)`", README))  # commands, not comments
    used = set(re.findall(r"(?:^|[\s/])guardian ([a-z][a-z-]+)", code, re.M))
    assert {"demo", "run", "tune", "report", "replay"} <= used
    assert used <= commands, used - commands


def test_the_contents_list_every_section_and_every_link_finds_its_heading() -> None:
    contents = README[README.index("## Contents"):README.index("## Quick start")]
    headings = re.findall(r"^## (.+)$", README, re.M)

    def anchor(title: str) -> str:
        return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")

    anchors = {anchor(h) for h in re.findall(r"^#{2,3} (.+)$", README, re.M)}
    linked = re.findall(r"\]\(#([\w-]+)\)", contents)
    assert set(linked) <= anchors, set(linked) - anchors
    assert {anchor(h) for h in headings if h != "Contents"} <= set(linked)


def test_the_example_config_and_the_readme_name_the_same_config_directory() -> None:
    example = (ROOT / "systemd" / "guardian.toml").read_text()
    assert "/etc/guardian/" not in example and "/etc/guardian/" not in README
    assert "/etc/vllm-guardian/" in example and "/etc/vllm-guardian/" in README
