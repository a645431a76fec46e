"""How each Sandbox Fusion language is compiled and run, and which toolchains exist here.

A spec names argv templates; `{python}` is the runtime interpreter and `{src}` the source
file written into the run's working directory.  Toolchains are looked up once at start-up,
so a missing one yields a clear message per request instead of a confusing exec failure.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from typing import Optional


@dataclasses.dataclass(frozen=True)
class LanguageSpec:
    name: str
    source: str
    run: tuple[str, ...]
    compile: Optional[tuple[str, ...]] = None
    needs: tuple[str, ...] = ()
    """Executables (besides the runtime python) that must exist on PATH."""
    etc: tuple[str, ...] = ()
    """Entries of /etc the toolchain reads, bound into the sandbox's minimal /etc."""


SPECS: dict[str, LanguageSpec] = {spec.name: spec for spec in (
    LanguageSpec("python", "main.py", ("{python}", "main.py")),
    LanguageSpec("pytest", "test_main.py", ("{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_main.py")),
    LanguageSpec("python_gpu", "main.py", ("{python}", "main.py")),
    LanguageSpec("python2", "main.py", ("python2", "main.py"), needs=("python2",)),
    LanguageSpec("bash", "main.sh", ("bash", "main.sh"), needs=("bash",)),
    LanguageSpec("cpp", "main.cpp", ("./main",), ("g++", "-std=c++17", "-O2", "main.cpp", "-o", "main", "-lm", "-lpthread"),
                 needs=("g++",)),
    LanguageSpec("cuda", "main.cu", ("./main",), ("nvcc", "main.cu", "-o", "main"), needs=("nvcc",)),
    LanguageSpec("gtest", "main.cpp", ("./main",),
                 ("g++", "-std=c++17", "-O2", "main.cpp", "-o", "main", "-lgtest", "-lgtest_main", "-lpthread"),
                 needs=("g++", "/usr/include/gtest/gtest.h")),
    LanguageSpec("go", "main.go", ("./main",), ("go", "build", "-o", "main", "main.go"), needs=("go",)),
    LanguageSpec("go_test", "main_test.go", ("go", "test", "-v", "main_test.go"), needs=("go",)),
    LanguageSpec("java", "Main.java", ("java", "-cp", ".", "Main"), ("javac", "-encoding", "utf8", "Main.java"),
                 needs=("javac", "java")),
    LanguageSpec("junit", "Main.java", ("java", "-cp", ".", "Main"), ("javac", "-encoding", "utf8", "Main.java"),
                 needs=("javac", "java")),
    LanguageSpec("nodejs", "main.js", ("node", "main.js"), needs=("node",)),
    LanguageSpec("jest", "main.test.js", ("npx", "jest", "main.test.js"), needs=("npx", "jest")),
    LanguageSpec("react", "main.jsx", ("node", "main.jsx"), needs=("node", "react")),
    LanguageSpec("typescript", "main.ts", ("tsx", "main.ts"), needs=("tsx",)),
    LanguageSpec("rust", "main.rs", ("./main",), ("rustc", "-O", "--edition", "2021", "main.rs", "-o", "main"),
                 needs=("rustc",)),
    LanguageSpec("perl", "main.pl", ("perl", "main.pl"), needs=("perl",)),
    LanguageSpec("php", "main.php", ("php", "main.php"), needs=("php",)),
    LanguageSpec("ruby", "main.rb", ("ruby", "main.rb"), needs=("ruby",)),
    LanguageSpec("lua", "main.lua", ("lua", "main.lua"), needs=("lua",)),
    LanguageSpec("R", "main.R", ("Rscript", "main.R"), needs=("Rscript",)),
    LanguageSpec("julia", "main.jl", ("julia", "main.jl"), needs=("julia",)),
    LanguageSpec("scala", "main.scala", ("scala", "main.scala"), needs=("scala",)),
    LanguageSpec("kotlin_script", "main.kts", ("kotlinc", "-script", "main.kts"), needs=("kotlinc",)),
    LanguageSpec("csharp", "main.cs", ("mono", "main.exe"), ("mcs", "main.cs", "-out:main.exe"), needs=("mcs", "mono")),
    LanguageSpec("sql", "main.sql", ("sqlite3", ":memory:", ".read main.sql"), needs=("sqlite3",)),
    LanguageSpec("D_ut", "main.d", ("./main",), ("dmd", "-unittest", "main.d", "-of=main"), needs=("dmd",)),
    LanguageSpec("lean", "main.lean", ("lean", "main.lean"), needs=("lean",)),
    LanguageSpec("swift", "main.swift", ("swift", "main.swift"), needs=("swift",)),
    LanguageSpec("racket", "main.rkt", ("racket", "main.rkt"), needs=("racket",)),
    LanguageSpec("verilog", "main.v", ("vvp", "main"), ("iverilog", "-o", "main", "main.v"), needs=("iverilog", "vvp")),
)}

STANDARD_DIRS = ("/usr/", "/bin/", "/sbin/", "/lib", "/etc/")


@dataclasses.dataclass
class Toolchains:
    """What this machine can run: resolved executables and extra dirs the sandbox must see."""

    python: str
    executables: dict[str, str]
    extra_dirs: tuple[str, ...]
    missing: dict[str, tuple[str, ...]]
    importable: frozenset[str]
    """Modules (of those asked about) the runtime python can import."""

    def available_languages(self) -> list[str]:
        return sorted(name for name in SPECS if name not in self.missing)

    def missing_message(self, language: str) -> str:
        tools = ", ".join(repr(t) for t in self.missing[language])
        return f"language {language!r} needs {tools}, which is not installed on this server"

    def missing_summary(self) -> dict[str, str]:
        return {language: self.missing_message(language) for language in sorted(self.missing)}

    def argv(self, template: tuple[str, ...]) -> list[str]:
        return [self.python if part == "{python}" else self.executables.get(part, part) for part in template]


def _rust_toolchain(path: str) -> tuple[str, Optional[str]]:
    """rustup installs proxies in ~/.cargo/bin; the sandbox needs the real sysroot instead."""
    try:
        sysroot = subprocess.run([path, "--print", "sysroot"], capture_output=True, text=True, timeout=20,
                                 check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return path, None
    real = os.path.join(sysroot, "bin", "rustc")
    return (real, sysroot) if os.path.exists(real) else (path, None)


def importable_modules(python: str, modules: tuple[str, ...]) -> frozenset[str]:
    """Which of `modules` the runtime python finds (one probe process, nothing imported)."""
    probe = "import importlib.util, sys\nprint(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m)))"
    found = subprocess.run([python, "-I", "-c", probe, *modules], capture_output=True, text=True)
    return frozenset(found.stdout.split())


def detect_toolchains(python: str, modules: tuple[str, ...] = ()) -> Toolchains:
    """Resolve every language's tools; `modules` are runtime libraries to look for besides pytest."""
    executables: dict[str, str] = {}
    extra: set[str] = set()
    missing: dict[str, tuple[str, ...]] = {}
    for spec in SPECS.values():
        absent = []
        for tool in spec.needs:
            if tool in executables:
                continue
            if tool.startswith("/"):  # a header or library the toolchain needs
                if not os.path.exists(tool):
                    absent.append(tool)
                continue
            path = shutil.which(tool)
            if path is None or "/shims/" in path:  # pyenv/rbenv shims need their manager, absent inside
                absent.append(tool)
                continue
            if tool == "rustc":
                path, sysroot = _rust_toolchain(path)
                if sysroot:
                    extra.add(sysroot)
            real = os.path.realpath(path)
            if not real.startswith(STANDARD_DIRS):
                extra.add(os.path.dirname(os.path.dirname(real)))
            executables[tool] = path
        if absent:
            missing[spec.name] = tuple(absent)
    importable = importable_modules(python, ("pytest", *modules))
    if "pytest" not in importable:
        missing["pytest"] = ("pytest (in the runtime python)",)
    return Toolchains(python, executables, tuple(sorted(extra)), missing, importable)
