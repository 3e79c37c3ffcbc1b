"""The README's test command brings the system packages the suite needs.

``make test`` runs ``scripts/system-packages test`` before pytest: on a fresh
machine it installs Redis 7, Chromium, its driver and openssl with apt-get
(as root, or through sudo without a password), and otherwise stops with the
one command to run. Here the script looks for the binaries under an empty
folder (a fresh machine), and ``apt-get``, ``id`` and ``sudo`` are small
stand-ins on PATH that record how they were called.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "system-packages"


def _stand_in(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


Result = tuple[subprocess.CompletedProcess[str], str]


def _run(tmp_path: Path, *, uid: int, sudo: bool, mode: str = "test") -> Result:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _stand_in(bin_dir, "apt-get", f'echo "apt-get $*" >> {calls}')
    _stand_in(bin_dir, "id", f'[ "$1" = -u ] && echo {uid} || exec /usr/bin/id "$@"')
    if sudo:
        record = f'echo "sudo $*" >> {calls}'
        _stand_in(bin_dir, "sudo", f'{record}; [ "$1" = -n ] && shift; [ "$1" = true ] || exec "$@"')
    empty_root = tmp_path / "fresh"
    empty_root.mkdir()
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "SYSTEM_PACKAGES_ROOT": str(empty_root),
    }
    if not sudo:
        # No sudo anywhere on PATH: /usr/bin may hold a real one.
        (bin_dir / "sudo").symlink_to("/nonexistent/sudo")
    result = subprocess.run(["bash", str(SCRIPT), mode], env=env, capture_output=True, text=True, timeout=60)
    return result, calls.read_text() if calls.exists() else ""


def test_as_root_a_fresh_machine_gets_redis_chromium_its_driver_with_apt_get(tmp_path: Path) -> None:
    result, calls = _run(tmp_path, uid=0, sudo=False)
    assert result.returncode == 0, result.stderr
    assert "apt-get update" in calls
    install = [line for line in calls.splitlines() if " install " in line]
    assert len(install) == 1
    for package in ("redis-server", "chromium", "chromium-driver"):
        assert f" {package}" in install[0]


def test_without_root_it_goes_through_sudo_when_sudo_asks_no_password(tmp_path: Path) -> None:
    result, calls = _run(tmp_path, uid=1000, sudo=True)
    assert result.returncode == 0, result.stderr
    assert "sudo -n apt-get update" in calls
    assert "chromium-driver" in calls


def test_without_root_or_sudo_it_prints_the_one_command_to_run_and_fails(tmp_path: Path) -> None:
    result, calls = _run(tmp_path, uid=1000, sudo=False)
    assert result.returncode == 1
    assert calls == ""
    assert "apt-get install -y --no-install-recommends redis-server chromium chromium-driver" in result.stderr
    assert "then run the make command again" in result.stderr


def test_make_test_runs_the_system_packages_step_before_pytest() -> None:
    dry = subprocess.run(
        ["make", "-n", "test"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    assert dry.returncode == 0, dry.stderr
    lines = dry.stdout.splitlines()
    step = next(i for i, line in enumerate(lines) if "scripts/system-packages test" in line)
    tests = next(i for i, line in enumerate(lines) if "/pytest" in line)
    assert step < tests


def test_ci_calls_make_test_and_installs_no_package_list_of_its_own() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\nmake test\n" in ci
    assert "chromium" not in ci
