"""Each language's `etc` list is enough: its hello world compiles and runs under bubblewrap with only
those /etc entries (plus the loader's and account files) bound, as the sandbox will bind them."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.unit.test_languages import DOUBLE, TEST_RUNNERS
from verl_sf.executor.config import ExecutorConfig
from verl_sf.executor.languages import SPECS, Toolchains, detect_toolchains, etc_paths
from verl_sf.executor.sandbox import sandbox_env


@pytest.fixture(scope="module")
def toolchains() -> Toolchains:
    return detect_toolchains(sys.executable)


def bwrap_argv(toolchains: Toolchains, language: str, workdir: str) -> list[str]:
    """A minimal sandbox: /usr, the runtimes, a private /tmp and only this language's /etc entries."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr", "--proc", "/proc",
            "--dev", "/dev", "--tmpfs", "/tmp", "--bind", workdir, "/workdir", "--chdir", "/workdir"]
    for top in ("/bin", "/sbin", "/lib", "/lib64"):
        argv += ["--symlink", os.readlink(top), top] if os.path.islink(top) else ["--ro-bind", top, top]
    for path in etc_paths([language]):
        argv += ["--ro-bind", path, path]
    runtime_dirs = {sys.prefix, sys.base_prefix, *toolchains.extra_dirs}
    for path in sorted(d for d in runtime_dirs if not d.startswith("/usr") and os.path.exists(d)):
        argv += ["--ro-bind", path, path]
    return argv


# Hello world (prints 42 for stdin 21) and, for test-runner languages, a passing suite (exit 0).
PROGRAMS = {**DOUBLE, **{name: template.format(body="n * 2") for name, template in TEST_RUNNERS.items()}}


def run_in_minimal_sandbox(toolchains: Toolchains, language: str) -> str:
    """"42" (or "passed" for a test runner), else what went wrong."""
    spec = SPECS[language]
    source = spec.prepare_source(PROGRAMS[language])
    env = sandbox_env(ExecutorConfig(python=sys.executable), toolchains)
    with tempfile.TemporaryDirectory() as workdir:
        for name, text in {source.filename: source.code, **source.extra_files}.items():
            with open(os.path.join(workdir, name), "w") as fh:
                fh.write(text)
        prefix = [*bwrap_argv(toolchains, language, workdir), "--clearenv"]
        for key, value in {**env, "HOME": "/workdir", "TMPDIR": "/tmp"}.items():
            prefix += ["--setenv", key, value]
        prefix.append("--")
        if spec.compile:
            built = subprocess.run([*prefix, *toolchains.argv(spec.compile, source.params)], capture_output=True,
                                   text=True, timeout=300, check=False)
            if built.returncode != 0:
                return f"compile failed: {built.stdout}{built.stderr}"
        ran = subprocess.run([*prefix, *toolchains.argv(spec.run, source.params)], input="21\n", capture_output=True,
                             text=True, timeout=300, check=False)
        if ran.returncode != 0:
            return f"run failed ({ran.returncode}): {ran.stdout}{ran.stderr}"
        return "passed" if language in TEST_RUNNERS else ran.stdout.strip()


@pytest.fixture(scope="module")
def outputs(toolchains: Toolchains) -> dict[str, str]:
    with ThreadPoolExecutor(4) as pool:
        return dict(zip(PROGRAMS, pool.map(lambda name: run_in_minimal_sandbox(toolchains, name), PROGRAMS)))


@pytest.mark.parametrize("language", sorted(PROGRAMS))
def test_language_runs_with_only_its_etc_entries(outputs: dict[str, str], language: str) -> None:
    assert outputs[language] == ("passed" if language in TEST_RUNNERS else "42"), outputs[language]
