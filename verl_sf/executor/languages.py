"""How each Sandbox Fusion language is compiled and run, and which toolchains exist here.

A spec names argv templates: `{python}` is the runtime interpreter, `{runtime}` verl-sf's own
runtime directory (npm packages), and a spec's `prepare` may add more (scala's object name).
Toolchains are looked up once at start-up, so a missing one yields a clear message per request
instead of a confusing exec failure.  Sandbox Fusion's runners (sandbox/runners/{major,minor}.py)
are the reference for commands and file names; docs/languages.md lists where we differ.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Callable

from verl_sf.errors import InputError
from verl_sf.executor.gpus import cuda_bin_dirs
from verl_sf.executor.language_packages import install_hint

RUNTIME_DIR_ENV = "VERL_SF_RUNTIME_DIR"
NODE_MODULES = "{runtime}/node/node_modules"
JAVA_CLASSPATH = ".:*:/usr/share/java/javatuples.jar"
"""As SF's: the working directory, any jar sent in `files`, and javatuples."""
JUNIT_CONSOLE = "/usr/share/java/junit-platform-console-standalone.jar"
JUNIT_CLASSPATH = f"{JAVA_CLASSPATH}:{JUNIT_CONSOLE}"
CSHARP_IMPLICIT_USINGS = ("System", "System.IO", "System.Linq", "System.Collections.Generic", "System.Net.Http",
                          "System.Threading", "System.Threading.Tasks")
"""What `dotnet new console` (SF's C# runner) imports implicitly; mcs has no global usings."""

# /etc entries every toolchain may read (dynamic loader, accounts, name service, time zone).
COMMON_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/passwd", "/etc/group",
              "/etc/nsswitch.conf", "/etc/localtime")


class SourceRejected(InputError):
    """The code cannot be placed for its language (as SF: scala code without an object)."""


@dataclasses.dataclass(frozen=True)
class PreparedSource:
    filename: str
    code: str
    params: dict[str, str] = dataclasses.field(default_factory=dict)
    """Extra argv template values (`{object}`), found in the code."""
    extra_files: dict[str, str] = dataclasses.field(default_factory=dict)
    """Files the toolchain needs beside the source (name -> text)."""


@dataclasses.dataclass(frozen=True)
class LanguageSpec:
    name: str
    source: str
    run: tuple[str, ...]
    compile: tuple[str, ...] | None = None
    needs: tuple[str, ...] = ()
    """Executables (besides the runtime python) that must exist on PATH or in the runtime dir's
    bin; absolute paths are files (headers, jars, devices) that must exist."""
    etc: tuple[str, ...] = ()
    """/etc entries the toolchain reads besides COMMON_ETC (the sandbox binds only these): found by
    running it under bubblewrap with one entry left out at a time (tests/integration/test_language_etc.py
    keeps the lists sufficient).  /etc/alternatives is where Debian's `java`, `php`, `lua`, `cc` lead;
    /etc/php loads PHP's extensions and /etc/racket Racket's collection paths."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment the toolchain needs inside the sandbox; `{runtime}` is filled in.  Every run sees
    the union, so no variable here may change another language (FORCE_COLOR would colour pytest)."""
    prepare: Callable[[str], PreparedSource] | None = None
    """How the code becomes the source file, when it is more than writing it to `source`."""
    gpu: bool = False
    """Runs on a GPU slot, in the sandbox of its GPU (served only with `verl-sf serve --gpus`)."""

    def prepare_source(self, code: str) -> PreparedSource:
        return self.prepare(code) if self.prepare else PreparedSource(self.source, code)


def _php_source(code: str) -> PreparedSource:
    """As SF's ensure_php_tag_in_string: code without the opening tag gets one."""
    stripped = code.lstrip()
    return PreparedSource("main.php", stripped if stripped.startswith("<?php") else "<?php\n" + stripped)


# mono only logs a failed Debug.Assert and exits 0; dotnet (SF's toolchain) aborts.  This trace
# listener, registered by main.exe.config, ends the run the way dotnet does: message, stack, 134.
CSHARP_ASSERT_LISTENER = (
    "\nnamespace VerlSf { public sealed class AssertExit : System.Diagnostics.TraceListener {"
    " public override void Write(string m) {} public override void WriteLine(string m) {}"
    " public override void Fail(string message, string detail) { System.Console.Error.WriteLine("
    "\"Process terminated. Assertion failed.\" + System.Environment.NewLine + message + System.Environment.NewLine"
    " + System.Environment.StackTrace); System.Environment.Exit(134); } } }\n")
CSHARP_APP_CONFIG = ('<?xml version="1.0"?>\n<configuration><system.diagnostics><trace><listeners>'
                     '<add name="verl-sf" type="VerlSf.AssertExit, main"/></listeners></trace></system.diagnostics>'
                     '</configuration>\n')


def _csharp_source(code: str) -> PreparedSource:
    """Prepends the usings dotnet adds implicitly (on the first line, so error line numbers stay the
    code's) and appends the listener that makes a failed Debug.Assert fail the run."""
    usings = "".join(f"using {ns}; " for ns in CSHARP_IMPLICIT_USINGS  # not twice: mcs warns (CS0105)
                     if not re.search(rf"^\s*using\s+{re.escape(ns)}\s*;", code, re.MULTILINE))
    return PreparedSource("main.cs", usings + code + CSHARP_ASSERT_LISTENER,
                          extra_files={"main.exe.config": CSHARP_APP_CONFIG})


def _junit_source(code: str) -> PreparedSource:
    """SF names the file after the public class (javac requires it), else Main.java."""
    match = re.search(r"\bpublic\s+(abstract\s+|final\s+)?class\s+(\w+)", code)
    return PreparedSource(f"{match.group(2) if match else 'Main'}.java", code)


def _scala_source(code: str) -> PreparedSource:
    """SF runs the first `object` the code declares and refuses code without one."""
    match = re.search(r"object\s+(\w+)", code)
    if match is None:
        raise SourceRejected("Object name not found.")
    return PreparedSource("main.scala", code, {"object": match.group(1)})


JVM_ETC = ("/etc/java-17-openjdk", "/etc/alternatives")
# GOPATH mode over Debian's Go packages (testify among them): no module download, ever.
GO_ENV = (("GO111MODULE", "off"), ("GOPATH", "/usr/share/gocode"), ("GOCACHE", "/tmp/go-build"), ("GOPROXY", "off"))
NODE_ENV = (("NODE_PATH", NODE_MODULES),)

SPECS: dict[str, LanguageSpec] = {spec.name: spec for spec in (
    LanguageSpec("python", "main.py", ("{python}", "main.py")),
    LanguageSpec("pytest", "test_main.py",
                 ("{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_main.py")),
    LanguageSpec("python_gpu", "main.py", ("{python}", "main.py"), gpu=True),
    LanguageSpec("python2", "main.py", ("python2", "main.py"), needs=("python2",)),
    LanguageSpec("bash", "main.sh", ("bash", "main.sh"), needs=("bash",)),
    # Assertions stay on everywhere (java -ea, rust debug assertions, no NDEBUG, no dmd -release):
    # MultiPL-E style tests are assert statements, and with them off every candidate passes.
    LanguageSpec("cpp", "main.cpp", ("./main",),
                 ("g++", "-std=c++17", "-O2", "main.cpp", "-o", "main", "-lm", "-lpthread"),
                 needs=("g++",)),
    LanguageSpec("cuda", "main.cu", ("./main",), ("nvcc", "main.cu", "-o", "main"), needs=("nvcc",), gpu=True),
    LanguageSpec("gtest", "main.cpp", ("./main",),
                 ("g++", "-std=c++17", "-O2", "main.cpp", "-o", "main", "-lgtest", "-lgtest_main", "-lpthread"),
                 needs=("g++", "/usr/include/gtest/gtest.h")),
    LanguageSpec("go", "main.go", ("./main",), ("go", "build", "-o", "main", "main.go"), needs=("go",), env=GO_ENV),
    LanguageSpec("go_test", "main_test.go", ("go", "test", "main_test.go"),
                 needs=("go", "/usr/share/gocode/src/github.com/stretchr/testify/assert"), env=GO_ENV),
    LanguageSpec("java", "Main.java", ("java", "-ea", "-cp", JAVA_CLASSPATH, "Main"),
                 ("javac", "-encoding", "utf8", "-cp", JAVA_CLASSPATH, "Main.java"),
                 needs=("javac", "java", "/usr/share/java/javatuples.jar"), etc=JVM_ETC),
    LanguageSpec("junit", "Main.java",
                 ("java", "-ea", "-jar", JUNIT_CONSOLE, "--class-path", JUNIT_CLASSPATH, "--scan-class-path"),
                 ("bash", "-c", 'exec javac -encoding utf8 -cp "$0" *.java', JUNIT_CLASSPATH),
                 needs=("bash", "javac", "java", "/usr/share/java/javatuples.jar", JUNIT_CONSOLE), etc=JVM_ETC,
                 prepare=_junit_source),
    LanguageSpec("nodejs", "main.js", ("node", "main.js"), needs=("node",), env=NODE_ENV),
    LanguageSpec("jest", "main.test.ts",
                 ("node", f"{NODE_MODULES}/jest/bin/jest.js", "--config", "{runtime}/node/jest.config.js", "--ci"),
                 needs=("node", "jest"), env=NODE_ENV),
    LanguageSpec("react", "main.jsx", ("node", "main.jsx"), needs=("node", "react")),
    # tsx as node's loader, not its CLI: the CLI relays to a second node over a unix socket, which the
    # landlock rung refuses (and a second node costs a start).
    LanguageSpec("typescript", "main.ts", ("node", "--import", f"{NODE_MODULES}/tsx/dist/loader.mjs", "main.ts"),
                 needs=("node", "tsx"), env=NODE_ENV),
    LanguageSpec("rust", "main.rs", ("./main",), ("rustc", "-O", "-C", "debug-assertions=on", "--edition", "2021",
                                                  "main.rs", "-o", "main"),
                 needs=("rustc",), etc=("/etc/alternatives",)),  # `cc`, the linker
    LanguageSpec("perl", "main.pl", ("perl", "main.pl"), needs=("perl",)),
    # Debian's php.ini is the production one (zend.assertions=-1: assert() compiled out).
    LanguageSpec("php", "main.php", ("php", "-d", "zend.assertions=1", "-f", "main.php"), needs=("php",),
                 etc=("/etc/php", "/etc/alternatives"), prepare=_php_source),
    LanguageSpec("ruby", "main.rb", ("ruby", "main.rb"), needs=("ruby",)),
    LanguageSpec("lua", "main.lua", ("lua", "main.lua"), needs=("lua",), etc=("/etc/alternatives",)),
    LanguageSpec("R", "main.R", ("Rscript", "main.R"), needs=("Rscript",), etc=("/etc/R", "/etc/alternatives")),
    LanguageSpec("julia", "main.jl", ("julia", "main.jl"), needs=("julia",)),
    LanguageSpec("scala", "main.scala", ("scala", "-J-ea", "{object}"), ("scalac", "main.scala"),
                 needs=("scalac", "scala"), etc=JVM_ETC, prepare=_scala_source),
    LanguageSpec("kotlin_script", "main.kts", ("kotlinc", "-J-ea", "-script", "main.kts"), needs=("kotlinc",),
                 etc=JVM_ETC),
    LanguageSpec("csharp", "main.cs", ("mono", "main.exe"), ("mcs", "-d:DEBUG", "-d:TRACE", "main.cs", "-out:main.exe"),
                 needs=("mcs", "mono"), etc=("/etc/mono",), prepare=_csharp_source),
    LanguageSpec("sql", "main.sql", ("sqlite3", ":memory:", ".read main.sql"), needs=("sqlite3",)),
    LanguageSpec("D_ut", "main.d", ("./main",), ("gdc", "-funittest", "main.d", "-o", "main"), needs=("gdc",)),
    LanguageSpec("lean", "Main.lean", ("lake", "build"), needs=("lake",)),
    LanguageSpec("swift", "main.swift", ("./main",), ("swiftc", "main.swift", "-o", "main"), needs=("swiftc",)),
    LanguageSpec("racket", "main.rkt", ("racket", "main.rkt"), needs=("racket",), etc=("/etc/racket",)),
    LanguageSpec("verilog", "main.sv", ("vvp", "-n", "test.vvp"),
                 ("iverilog", "-Wall", "-Winfloop", "-Wno-timescale", "-g2012", "-s", "tb", "-o", "test.vvp",
                  "main.sv"),
                 needs=("iverilog", "vvp")),
)}

STANDARD_DIRS = ("/usr/", "/bin/", "/sbin/", "/lib", "/etc/")


SYSTEM_RUNTIME_DIR = "/opt/verl-sf/runtime"


def default_runtime_dir() -> str:
    """Where `verl-sf languages install` puts npm packages: system-wide for root; for anyone else
    their own directory, or the system-wide one when only that exists (an administrator filled it)."""
    if os.environ.get(RUNTIME_DIR_ENV):
        return os.environ[RUNTIME_DIR_ENV]
    if os.geteuid() == 0:
        return SYSTEM_RUNTIME_DIR
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    own = os.path.join(data_home, "verl-sf", "runtime")
    return SYSTEM_RUNTIME_DIR if not os.path.isdir(own) and os.path.isdir(SYSTEM_RUNTIME_DIR) else own


@dataclasses.dataclass
class Toolchains:
    """What this machine can run: resolved executables and extra dirs the sandbox must see."""

    python: str
    executables: dict[str, str]
    extra_dirs: tuple[str, ...]
    missing: dict[str, tuple[str, ...]]
    importable: frozenset[str]
    """Modules (of those asked about) the runtime python can import."""
    runtime_dir: str = ""
    """verl-sf's own runtime directory (bound read-only into the sandbox when it exists)."""
    refusals: dict[str, str] = dataclasses.field(default_factory=dict)
    """Why a language whose toolchain is installed is not served here anyway (no GPU, out of reach)."""

    def available_languages(self) -> list[str]:
        return sorted(name for name in SPECS if name not in self.missing)

    def missing_message(self, language: str) -> str:
        reasons = [f"needs {', '.join(repr(t) for t in self.missing[language])}, which is not installed on this "
                   f"server"] if self.missing[language] else []
        if language in self.refusals:
            reasons.append(self.refusals[language])
        return f"language {language!r} {' and '.join(reasons)}; {install_hint(language)}"

    def refuse(self, language: str, reason: str) -> None:
        """`language` answers SandboxError with `reason`, toolchain or not."""
        self.refusals[language] = reason
        self.missing.setdefault(language, ())

    def refuse_gpu_languages(self, reason: str) -> None:
        """No GPU runs on this server: the GPU languages answer SandboxError with `reason`."""
        for spec in SPECS.values():
            if spec.gpu:
                self.refuse(spec.name, reason)

    def refuse_out_of_reach(self, unreachable: list[str]) -> None:
        """Runs whose uid cannot traverse to `unreachable` directories (the landlock rung as root, a
        toolchain under a 0700 /root) cannot run the languages whose tools live there: refused, named."""
        for spec in SPECS.values():
            if spec.name in self.missing:
                continue
            tools = [os.path.realpath(self.executables.get(tool, tool)) for tool in spec.needs]
            out = sorted({d for d in unreachable for tool in tools if tool == d or tool.startswith(d + "/")})
            if out:
                self.refuse(spec.name, f"has its toolchain in {', '.join(out)}, out of the runs' uids' reach on this "
                                       "rung (move it, or chmod o+x its parent directories)")

    def fill(self, part: str, params: dict[str, str] | None = None) -> str:
        values = {"{python}": self.python, "{runtime}": self.runtime_dir,
                  **{"{" + key + "}": value for key, value in (params or {}).items()}}
        for key, value in values.items():
            part = part.replace(key, value)
        return part

    def missing_summary(self) -> dict[str, str]:
        """Each language this server cannot run, and why (for /health)."""
        return {language: self.missing_message(language) for language in sorted(self.missing)}

    def argv(self, template: tuple[str, ...], params: dict[str, str] | None = None) -> list[str]:
        return [self.executables.get(part, self.fill(part, params)) for part in template]

    def env(self) -> dict[str, str]:
        """The environment every available language asks for (their keys do not collide)."""
        return {key: self.fill(value) for spec in SPECS.values() if spec.name not in self.missing
                for key, value in spec.env}


def etc_paths(languages: list[str]) -> list[str]:
    """The /etc entries the sandbox must show for these languages (those that exist here)."""
    wanted = dict.fromkeys([*COMMON_ETC, *(path for name in languages for path in SPECS[name].etc)])
    return [path for path in wanted if os.path.lexists(path)]


def _rust_toolchain(path: str) -> tuple[str, str | None]:
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
    found = subprocess.run([python, "-I", "-c", probe, *modules], capture_output=True, text=True, check=False)
    return frozenset(found.stdout.split())


def detect_toolchains(python: str, modules: tuple[str, ...] = (), runtime_dir: str | None = None) -> Toolchains:
    """Resolve every language's tools; `modules` are runtime libraries to look for besides pytest."""
    runtime_dir = runtime_dir or default_runtime_dir()
    search_path = os.pathsep.join([os.environ.get("PATH", os.defpath), os.path.join(runtime_dir, "bin"),
                                   *cuda_bin_dirs()])
    executables: dict[str, str] = {}
    extra: set[str] = {runtime_dir} if os.path.isdir(runtime_dir) else set()
    missing: dict[str, tuple[str, ...]] = {}
    for spec in SPECS.values():
        absent = []
        for tool in spec.needs:
            if tool in executables:
                continue
            if tool.startswith("/"):  # a header, jar, library or device the toolchain needs
                if not os.path.exists(tool):
                    absent.append(tool)
                continue
            path = shutil.which(tool, path=search_path)
            if path is None or "/shims/" in path:  # pyenv/rbenv shims need their manager, absent inside
                absent.append(tool)
                continue
            if tool == "rustc":
                path, sysroot = _rust_toolchain(path)
                if sysroot:
                    extra.add(sysroot)
            real = os.path.realpath(path)
            if not real.startswith((*STANDARD_DIRS, runtime_dir + "/")):
                extra.add(os.path.dirname(os.path.dirname(real)))
            executables[tool] = path
        if absent:
            missing[spec.name] = tuple(absent)
    importable = importable_modules(python, ("pytest", *modules))
    if "pytest" not in importable:
        missing["pytest"] = ("pytest (in the runtime python)",)
    return Toolchains(python, executables, tuple(sorted(extra)), missing, importable, runtime_dir)
