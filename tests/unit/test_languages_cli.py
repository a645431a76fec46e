"""`verl-sf languages list|install`, as root and as an ordinary user (`runuser -u nobody`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from verl_sf.executor.language_packages import SOURCES
from verl_sf.executor.languages import detect_toolchains

REPO = Path(__file__).resolve().parents[2]
VERL_SF = [sys.executable, "-m", "verl_sf.cli"]


def verl_sf(*args: str, user: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    argv = [*VERL_SF, *args]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd="/", check=False)


def test_list_shows_every_language_with_version_or_fix() -> None:
    done = verl_sf("languages", "list")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if not line.startswith("runtime directory")}
    assert set(rows) == set(SOURCES)
    assert "installed  go version go1." in rows["go"]
    assert "installed  openjdk version" in rows["java"]
    for name, source in SOURCES.items():
        if source.unavailable:
            assert "missing" in rows[name] and source.unavailable in rows[name]
        else:
            assert "  installed  " in rows[name], rows[name]


def test_list_names_the_install_command_for_a_missing_language(tmp_path: Path) -> None:
    done = verl_sf("languages", "list", "--runtime-dir", str(tmp_path / "empty"))
    jest = next(line for line in done.stdout.splitlines() if line.startswith("jest "))
    assert "missing" in jest and "`verl-sf languages install jest` (as root)" in jest


def test_install_of_what_is_there_is_a_no_op() -> None:
    done = verl_sf("languages", "install", "lua", "go_test")
    assert done.returncode == 0, done.stderr
    assert "already installed: lua, go_test" in done.stdout


def test_install_npm_languages_as_root_into_a_fresh_runtime_dir(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    done = verl_sf("languages", "install", "typescript", "jest", "--runtime-dir", str(runtime))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"npm install --prefix {runtime}/node" in done.stdout
    assert (runtime / "node" / "node_modules" / "lodash" / "package.json").exists()
    assert (runtime / "bin" / "tsx").resolve().exists()
    toolchains = detect_toolchains(sys.executable, runtime_dir=str(runtime))
    assert {"typescript", "jest", "nodejs"} <= set(toolchains.available_languages())
    assert str(runtime) in toolchains.extra_dirs  # bound read-only into every sandbox


def test_install_as_an_ordinary_user_says_what_to_ask_for() -> None:
    shared = Path(tempfile.mkdtemp(prefix="verl-sf-lang-"))  # pytest's tmp_path is root's alone
    try:
        shared.chmod(0o755)
        runtime = shared / "runtime"
        done = verl_sf("languages", "install", "typescript", "--runtime-dir", str(runtime), user="nobody")
        assert done.returncode == 1, done.stderr
        assert "needs root; ask an administrator to run" in done.stderr
        assert f"npm install --prefix {runtime}/node" in done.stderr
        assert not runtime.exists()
    finally:
        shutil.rmtree(shared)


@pytest.mark.parametrize("name", ["julia", "lean", "swift", "cuda", "python_gpu"])
def test_install_of_an_uninstallable_language_says_why(name: str) -> None:
    done = verl_sf("languages", "install", name)
    assert done.returncode == 1
    assert f"{name}: cannot be installed here: {SOURCES[name].unavailable}" in done.stderr


def test_install_of_an_unknown_name_is_an_error() -> None:
    done = verl_sf("languages", "install", "cobol")
    assert done.returncode == 2
    assert "unknown language(s) 'cobol'" in done.stderr
