"""The built distributions hold every file the package reads at run time.

An editable install reads the checkout, so a file left out of the wheel goes
unnoticed until an installed copy fails at run time: the package-data
pattern ``lua/*.lua`` once left out ``lua/lib/requeue_job.lua``, and
recovery raised FileNotFoundError everywhere but in ``pip install -e``.

The sdist is built from a copy of the files git knows (so no stale
egg-info or ``build/`` of the checkout leaks in) and the wheel from that
sdist, which is what ``pip install django-cogworker`` builds from PyPI.
Both are then compared with the Lua files the code loads and with every
file git tracks under ``django_cogworker/``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_cogworker"
LUA = f"{PACKAGE}/lua"

#: A literal ``script("name")`` call: the script ``lua/<name>.lua``.
SCRIPT_CALL = re.compile(r"""\bscript\(\s*["']([^"']+)["']\s*\)""")
#: An include line, resolved from ``lua/lib/`` (see ``scripts.script``).
INCLUDE = re.compile(r"^--! include (.+)$", re.MULTILINE)

#: ``python -m build`` makes a fresh environment with setuptools in it.
BUILD_TIMEOUT_S = 100


def git_files(*args: str) -> list[str]:
    """Paths (relative to ROOT) that ``git ls-files`` names and that exist."""
    out = subprocess.run(
        ["git", "ls-files", "-z", *args], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [path for path in out.split("\0") if path and (ROOT / path).is_file()]


def lua_files_loaded() -> set[str]:
    """The Lua files the code loads: every ``script("...")`` and its includes."""
    names = set()
    for module in (ROOT / PACKAGE).rglob("*.py"):
        names.update(SCRIPT_CALL.findall(module.read_text()))
    assert names, f'no script("...") call found under {PACKAGE}/: has the regex gone stale?'
    files = set()
    for name in names:
        files.add(f"{LUA}/{name}.lua")
        source = ROOT / LUA / f"{name}.lua"
        if source.is_file():
            files.update(f"{LUA}/lib/{include.strip()}" for include in INCLUDE.findall(source.read_text()))
    return files


def lua_files_in_tree() -> set[str]:
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / LUA).rglob("*.lua")}


def tracked_package_files() -> set[str]:
    return set(git_files("--", PACKAGE))


@dataclass(frozen=True)
class Dists:
    wheel: Path
    wheel_files: frozenset[str] = field(repr=False)
    sdist: Path
    #: Paths inside the sdist, without its top folder (``django-cogworker-0.1.0/``).
    sdist_files: frozenset[str] = field(repr=False)


def only(paths: Iterable[Path], what: str) -> Path:
    found = list(paths)
    assert len(found) == 1, f"expected one {what}, found {[p.name for p in found]}"
    return found[0]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    if not (ROOT / ".git").exists() or not (ROOT / PACKAGE).is_dir():
        pytest.skip("builds the package from a git checkout; this copy of the tests has none")
    src = tmp_path_factory.mktemp("src")
    # Tracked files and new ones not ignored: what the next commit holds.
    for path in git_files("--cached", "--others", "--exclude-standard"):
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, src / path)
    out = tmp_path_factory.mktemp("dist")
    # No --sdist/--wheel: build makes the sdist, then the wheel from it.
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if proc.returncode != 0:
        pytest.fail(f"python -m build exited {proc.returncode}:\n{proc.stdout[-6000:]}{proc.stderr[-4000:]}")
    wheel = only(out.glob("*.whl"), "wheel")
    sdist = only(out.glob("*.tar.gz"), "sdist")
    with zipfile.ZipFile(wheel) as archive:
        wheel_files = frozenset(name for name in archive.namelist() if not name.endswith("/"))
    with tarfile.open(sdist) as archive:
        members = [member.name for member in archive.getmembers() if member.isfile()]
    sdist_files = frozenset(name.split("/", 1)[1] for name in members if "/" in name)
    return Dists(wheel, wheel_files, sdist, sdist_files)


def assert_holds(archive: Path, files: frozenset[str], expected: set[str], what: str) -> None:
    missing = sorted(expected - files)
    assert not missing, (
        f"{archive.name} lacks {len(missing)} of the {len(expected)} {what}:\n  "
        + "\n  ".join(missing)
        + "\nAn installed copy fails without them: widen [tool.setuptools.package-data] in pyproject.toml."
    )


def test_the_lua_files_the_code_loads_are_found() -> None:
    loaded = lua_files_loaded()
    assert f"{LUA}/requeue.lua" in loaded
    assert f"{LUA}/lib/requeue_job.lua" in loaded  # through requeue.lua's include


def test_wheel_holds_every_lua_file(dists: Dists) -> None:
    expected = lua_files_loaded() | lua_files_in_tree()
    assert_holds(dists.wheel, dists.wheel_files, expected, "Lua files the code loads or the tree holds")


def test_wheel_holds_every_tracked_package_file(dists: Dists) -> None:
    expected = {path for path in tracked_package_files() if not path.endswith(".py")}
    assert_holds(dists.wheel, dists.wheel_files, expected, f"non-Python files git tracks under {PACKAGE}/")


def test_wheel_holds_every_tracked_module(dists: Dists) -> None:
    expected = {path for path in tracked_package_files() if path.endswith(".py")}
    assert_holds(dists.wheel, dists.wheel_files, expected, f"modules git tracks under {PACKAGE}/")


def test_sdist_holds_every_package_file(dists: Dists) -> None:
    expected = lua_files_loaded() | lua_files_in_tree() | tracked_package_files()
    assert_holds(dists.sdist, dists.sdist_files, expected, f"files of {PACKAGE}/ the wheel is built from")
