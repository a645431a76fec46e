"""`verl-sf languages list|install`: which Sandbox Fusion languages this machine runs, and adding the rest.

Debian packages go in with apt-get (root only); npm packages into verl-sf's own runtime directory
(`{runtime}/node`, bound read-only into every sandbox), never the system's; the python runtime's
libraries into that interpreter with pip.  An ordinary user gets the commands to ask an
administrator for, and a non-zero exit.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from verl_sf.errors import InputError
from verl_sf.executor.gpus import host_gpus
from verl_sf.executor.language_packages import (
    DEFAULT_SET,
    NPM_PACKAGES,
    PYTHON_IMPORT_NAMES,
    PYTHON_LIBRARIES,
    RUNTIME_BIN,
    SOURCES,
    install_hint,
)
from verl_sf.executor.languages import (
    SPECS,
    Toolchains,
    default_runtime_dir,
    detect_toolchains,
)

VERSION_TIMEOUT_S = 60
APT_ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
BABEL_CONFIG = """module.exports = {
    presets: [['@babel/preset-env', { targets: { node: 'current' } }], '@babel/preset-typescript'],
};
"""
# Jest runs from the run's working directory; modules, babel and the cache come from the runtime.
JEST_CONFIG = """const os = require("os");
const path = require("path");
module.exports = {
    rootDir: process.cwd(),
    modulePaths: [path.join(__dirname, "node_modules")],
    cacheDirectory: path.join(os.tmpdir(), "jest-cache"),
    transform: {"\\\\.[jt]sx?$": [require.resolve("babel-jest"),
                                 {configFile: path.join(__dirname, "babel.config.js")}]},
    maxWorkers: 2,
    watchman: false,
};
"""
COMMAND_OF_PACKAGE = {"npm": "npm", "nodejs": "node", "rustc": "rustc", "golang-go": "go",
                      "openjdk-17-jdk-headless": "javac", "g++": "g++", "bash": "bash", "perl": "perl"}
PACKAGE_JSON = '{"name": "verl-sf-node-runtime", "private": true}\n'


class UnknownLanguage(InputError):
    """A name that is not one of Sandbox Fusion's languages."""


@dataclasses.dataclass
class InstallPlan:
    """What is missing for the asked-for languages, by where it comes from."""

    apt: list[str]
    npm: bool
    pip: list[str]
    unavailable: dict[str, str]

    def empty(self) -> bool:
        return not (self.apt or self.npm or self.pip)

    def commands(self, python: str, runtime_dir: str) -> list[list[str]]:
        steps = []
        if self.apt:
            steps += [["apt-get", "update", "-q"],
                      ["apt-get", "install", "-y", "-q", "--no-install-recommends", *self.apt]]
        if self.npm:
            steps.append(["npm", "install", "--prefix", os.path.join(runtime_dir, "node"), "--no-audit", "--no-fund",
                          "--loglevel=error", *NPM_PACKAGES])
        if self.pip:
            steps.append([python, "-m", "pip", "install", "-q", *self.pip])
        return steps


def resolve_names(names: list[str]) -> list[str]:
    """`all` means every language a package here can provide, `default` the quick common set;
    anything else must be an SF name."""
    if names == ["all"]:
        return [name for name, source in SOURCES.items() if not source.unavailable]
    if names == ["default"]:
        return list(DEFAULT_SET)
    unknown = [name for name in names if name not in SPECS]
    if unknown:
        raise UnknownLanguage(f"unknown language(s) {', '.join(map(repr, unknown))}; Sandbox Fusion's are: "
                              f"{', '.join(sorted(SPECS))}")
    return names


def _installed_debs(packages: set[str]) -> set[str]:
    if not packages:
        return set()
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\\n", *sorted(packages)],
                         capture_output=True, text=True, check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}


def _npm_complete(runtime_dir: str) -> bool:
    names = [spec.rsplit("@", 1)[0] if spec.rfind("@") > 0 else spec for spec in NPM_PACKAGES]
    wanted = [os.path.join("node", "node_modules", name, "package.json") for name in names]
    wanted += [os.path.join("node", name) for name in ("jest.config.js", "babel.config.js")]
    wanted += [os.path.join("bin", link) for link in RUNTIME_BIN]
    return all(os.path.exists(os.path.join(runtime_dir, path)) for path in wanted)


def plan_install(names: list[str], toolchains: Toolchains) -> InstallPlan:
    apt: set[str] = set()
    npm = pip = False
    unavailable = {}
    for name in names:
        source = SOURCES[name]
        if source.unavailable:
            unavailable[name] = source.unavailable
            continue
        apt.update(source.apt)
        npm |= source.npm
        pip |= source.pip
    missing_pip = [lib for lib in PYTHON_LIBRARIES if PYTHON_IMPORT_NAMES.get(lib, lib) not in toolchains.importable]
    # A toolchain already on PATH from elsewhere stands for its package: rustup's rustc, NodeSource's
    # nodejs (which carries npm, and conflicts with Debian's npm package), a JDK or Go of one's own.
    apt -= {package for package, command in COMMAND_OF_PACKAGE.items() if shutil.which(command)}
    return InstallPlan(apt=sorted(apt - _installed_debs(apt)), npm=npm and not _npm_complete(toolchains.runtime_dir),
                       pip=missing_pip if pip else [], unavailable=unavailable)


def _detect(python: str, runtime_dir: str) -> Toolchains:
    return detect_toolchains(python, tuple(PYTHON_IMPORT_NAMES.get(lib, lib) for lib in PYTHON_LIBRARIES), runtime_dir)


def _version(toolchains: Toolchains, language: str) -> str:
    argv = toolchains.argv(SOURCES[language].version)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False,
                              env={**os.environ, **toolchains.env()})
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(version unknown: {exc})"
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines()
             if line.strip() and "VM warning" not in line]  # Debian's kotlinc passes a deprecated JVM flag
    return lines[0] if lines else "(version unknown)"


def _write_node_runtime_files(runtime_dir: str) -> None:
    node = Path(runtime_dir, "node")
    node.mkdir(parents=True, exist_ok=True)
    for name, text in (("babel.config.js", BABEL_CONFIG), ("jest.config.js", JEST_CONFIG)):
        (node / name).write_text(text)
    if not (node / "package.json").exists():
        (node / "package.json").write_text(PACKAGE_JSON)
    bin_dir = Path(runtime_dir, "bin")
    bin_dir.mkdir(exist_ok=True)
    for link, target in RUNTIME_BIN.items():
        path = bin_dir / link
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(os.path.join("..", target))


def list_languages(args: argparse.Namespace) -> int:
    toolchains = _detect(args.python, args.runtime_dir)
    # A GPU language's toolchain (nvcc, the python) may be here without a GPU to run on.
    gpu_less = not host_gpus()
    available = [name for name in toolchains.available_languages() if not (gpu_less and SPECS[name].gpu)]
    with ThreadPoolExecutor(8) as pool:
        versions = dict(zip(available, pool.map(lambda name: _version(toolchains, name), available), strict=True))
    width = max(map(len, SPECS))
    for name in sorted(SPECS, key=str.lower):
        if name in versions:
            print(f"{name:<{width}}  installed  {versions[name]}")
        else:
            tools = ", ".join(toolchains.missing.get(name, ["an NVIDIA GPU"]))
            print(f"{name:<{width}}  missing    needs {tools}; {install_hint(name)}")
    print(f"runtime directory: {toolchains.runtime_dir}")
    return 0


def install_languages(args: argparse.Namespace) -> int:
    try:
        names = resolve_names(args.names)
    except UnknownLanguage as exc:
        print(f"verl-sf languages install: {exc}", file=sys.stderr)
        return 2
    toolchains = _detect(args.python, args.runtime_dir)
    plan = plan_install(names, toolchains)
    explicit_unavailable = {} if args.names in (["all"], ["default"]) else plan.unavailable
    for name, why in plan.unavailable.items():
        print(f"{name}: cannot be installed here: {why}", file=sys.stderr)
    steps = plan.commands(args.python, args.runtime_dir)
    if not steps:
        print(f"already installed: {', '.join(names)}")
        return 1 if explicit_unavailable else 0
    if os.geteuid() != 0:
        print("verl-sf languages install: installing toolchains needs root; ask an administrator to run:",
              file=sys.stderr)
        for step in steps:
            print("  " + " ".join(step), file=sys.stderr)
        if plan.npm:
            print(f"  (then: verl-sf languages install {' '.join(args.names)}  "
                  f"-- writes {args.runtime_dir}/node's configs)", file=sys.stderr)
        return 1
    for step in steps:
        print("+ " + " ".join(step), flush=True)
        if step[0] == "npm":
            _write_node_runtime_files(args.runtime_dir)
        done = subprocess.run(step, env=APT_ENV, check=False)
        if done.returncode != 0:
            print(f"verl-sf languages install: `{' '.join(step)}` failed (exit {done.returncode})", file=sys.stderr)
            return 1
    after = _detect(args.python, args.runtime_dir)
    still_missing = [name for name in names if name in after.missing and not SOURCES[name].unavailable]
    if still_missing:
        print(f"verl-sf languages install: still missing after install: {', '.join(still_missing)}", file=sys.stderr)
        return 1
    print(f"installed: {', '.join(name for name in names if not SOURCES[name].unavailable)}")
    return 1 if explicit_unavailable else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="languages_command", required=True)
    for name, func, help_text in (("list", list_languages, "each language: installed (version) or how to add it"),
                                  ("install", install_languages, "install toolchains (root), or say what to ask for")):
        p = sub.add_parser(name, help=help_text)
        if name == "install":
            p.add_argument("names", nargs="+", metavar="NAME",
                           help="Sandbox Fusion language names, `all`, or `default` (the common set)")
        p.add_argument("--python", default=sys.executable, help="runtime interpreter the code runs with (as serve)")
        p.add_argument("--runtime-dir", default=default_runtime_dir(),
                       help="verl-sf's runtime directory for npm packages (as serve's)")
        p.set_defaults(func=func)
