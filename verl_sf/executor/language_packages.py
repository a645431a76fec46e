"""Where each language's toolchain comes from: Debian 12 packages, npm packages installed into
verl-sf's own runtime directory, and the runtime python's libraries (PyPI).

`verl-sf languages install` (verl_sf/languages_cli.py) reads this table; a request for a language
whose toolchain is absent answers with `install_hint` in its SandboxError.
"""

from __future__ import annotations

import dataclasses

NPM_PACKAGES = ("@babel/core@7", "@babel/preset-env@7", "@babel/preset-typescript@7", "@jest/globals@29",
                "babel-jest@29", "jest@29", "lodash@4", "typescript@5", "tsx@4", "js-md5", "seedrandom", "random-seed",
                "commander")
"""SF's runtime/node package.json, less puppeteer (downloads a browser) and jsdom/testing-library."""
RUNTIME_BIN = {"tsx": "node/node_modules/.bin/tsx", "jest": "node/node_modules/.bin/jest",
               "tsc": "node/node_modules/.bin/tsc"}
"""Commands linked into `{runtime}/bin`, which the sandbox puts on PATH."""
PYTHON_LIBRARIES = ("numpy", "scipy", "sympy", "pandas", "matplotlib", "scikit-learn", "networkx", "pytest")
"""The CPU libraries RL code tasks import (setup.cfg's `scientific` extra), by PyPI name."""
PYTHON_IMPORT_NAMES = {"scikit-learn": "sklearn"}
JVM = ("openjdk-17-jdk-headless",)
NODE = ("nodejs", "npm")


@dataclasses.dataclass(frozen=True)
class Source:
    apt: tuple[str, ...] = ()
    npm: bool = False
    """Needs NPM_PACKAGES in the runtime directory."""
    pip: bool = False
    """Needs PYTHON_LIBRARIES in the runtime python."""
    version: tuple[str, ...] = ()
    """argv printing the toolchain's version (first line kept)."""
    unavailable: str = ""
    """Why no package here can provide it (then nothing is installed)."""


SOURCES: dict[str, Source] = {
    "python": Source(pip=True, version=("{python}", "--version")),
    "pytest": Source(pip=True, version=("{python}", "-m", "pytest", "--version")),
    "python_gpu": Source(unavailable="needs an NVIDIA GPU given to the server (`verl-sf serve --gpus`) and a "
                                     "CUDA build of the runtime python's PyTorch or CuPy",
                         version=("{python}", "--version")),
    "python2": Source(unavailable="Debian 12 ships no Python 2, and npm and PyPI do not provide an interpreter"),
    "bash": Source(apt=("bash",), version=("bash", "--version")),
    "cpp": Source(apt=("g++",), version=("g++", "--version")),
    "gtest": Source(apt=("g++", "libgtest-dev"), version=("g++", "--version")),
    "cuda": Source(unavailable="needs an NVIDIA GPU and the CUDA toolkit (nvcc), which no package here provides; "
                               "serve with `verl-sf serve --gpus`", version=("nvcc", "--version")),
    "go": Source(apt=("golang-go",), version=("go", "version")),
    "go_test": Source(apt=("golang-go", "golang-github-stretchr-testify-dev"), version=("go", "version")),
    "java": Source(apt=(*JVM, "libjavatuples-java"), version=("java", "-version")),
    "junit": Source(apt=(*JVM, "libjavatuples-java", "junit5"), version=("java", "-version")),
    "nodejs": Source(apt=NODE, npm=True, version=("node", "--version")),
    "jest": Source(apt=NODE, npm=True, version=("jest", "--version")),
    "typescript": Source(apt=NODE, npm=True, version=("tsx", "--version")),
    "react": Source(unavailable="Sandbox Fusion has no runner for it"),
    "rust": Source(apt=("rustc",), version=("rustc", "--version")),
    "perl": Source(apt=("perl", "libtest-deep-perl", "libdata-compare-perl"), version=("perl", "-e", "print $^V")),
    "php": Source(apt=("php-cli",), version=("php", "--version")),
    "ruby": Source(apt=("ruby",), version=("ruby", "--version")),
    "lua": Source(apt=("lua5.4", "lua-unit"), version=("lua", "-v")),
    "R": Source(apt=("r-base-core",), version=("Rscript", "--version")),
    "julia": Source(unavailable="Debian 12, npm and PyPI provide no Julia (PyPI's installers download it from "
                                "elsewhere, which this machine cannot reach)"),
    "scala": Source(apt=(*JVM, "scala"), version=("scalac", "-version")),
    "kotlin_script": Source(apt=(*JVM, "kotlin"), version=("kotlinc", "-version")),
    "csharp": Source(apt=("mono-mcs", "mono-runtime"), version=("mono", "--version")),
    "sql": Source(apt=("sqlite3",), version=("sqlite3", "--version")),
    "D_ut": Source(apt=("gdc",), version=("gdc", "--version")),
    "lean": Source(unavailable="Debian 12 has only elan, which downloads Lean toolchains (unreachable here); "
                               "npm and PyPI provide no Lean 4"),
    "swift": Source(unavailable="Debian 12's `swift` package is OpenStack Swift, not the language; npm and PyPI "
                                "provide no Swift compiler"),
    "racket": Source(apt=("racket",), version=("racket", "--version")),
    "verilog": Source(apt=("iverilog",), version=("iverilog", "-V")),
}
DEFAULT_SET = ("python", "pytest", "bash", "cpp", "java", "nodejs", "typescript", "jest", "go", "ruby", "php",
               "perl", "lua", "sql")
"""`verl-sf languages install default` (what `scripts/dev.sh serve` runs): the languages of the code-RL
sets verl users train on (MBPP, HumanEval and MultiPL-E's common ones, CodeContests, TACO, APPS), each
quick to add; `all` adds the heavy rest (rust, R, scala, kotlin, csharp, D, racket, verilog, ...)."""


def install_hint(language: str) -> str:
    """The fix for a missing language, or why there is none, for messages and `languages list`."""
    source = SOURCES[language]
    if source.unavailable:
        return f"it cannot be installed here: {source.unavailable}"
    return f"add it with `verl-sf languages install {language}` (as root)"
