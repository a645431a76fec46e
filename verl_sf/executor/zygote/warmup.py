"""Making the warm interpreter worth forking: libraries imported and exercised once, the heap
frozen and backed by huge pages, and the generators libraries seed at import reseeded per child."""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import gc
import importlib
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any, Optional

from . import ipython_shell
from .linux import MADV_COLLAPSE, MADV_HUGEPAGE, check, libc

# First calls into these libraries import submodules and fill caches; doing them once here
# spares every forked run.
WARMUPS = {
    "sympy": "import sympy as sp\nx, y = sp.symbols('x y')\nsp.solve(x**2 - 4, x)\n"
             "sp.simplify(sp.sin(x)**2 + sp.cos(x)**2)\n"
             "sp.factor(x**2 - y**2)\nsp.integrate(x**2, x)\nsp.diff(sp.exp(x) * x, x)\nsp.Rational(1, 3) + 1\n"
             "sp.sqrt(8)\nsp.N(sp.pi, 10)\nsp.Matrix([[1, 2], [3, 4]]).det()\nsp.limit(sp.sin(x) / x, x, 0)\n",
    "numpy": "import numpy as np\na = np.arange(10)\na.sum(); a.mean(); np.linalg.inv(np.eye(3))\n"
             "np.random.default_rng(0).random(3)\n",
    "scipy": "import scipy.optimize, scipy.special, scipy.stats, scipy.integrate, scipy.linalg\n",
}

# Generators that libraries seed once, at import: every forked run would replay the same
# numbers, where a fresh `python main.py` draws new ones.  Each child reseeds them from OS entropy.
RESEEDED_MODULES = ("numpy.random", "sympy.core.random")
MT19937_KEY_WORDS = 624  # numpy's mt19937_state: uint32_t key[624], then int pos
MT19937_KEY_BYTES = MT19937_KEY_WORDS * 4


def preload(modules: list[str], cells: bool = False) -> Callable[[], None]:
    """Import and warm up what is there (a missing optional library is just not preloaded), and
    for a zygote that serves cells IPython's shell; then freeze the heap: the collector then never
    dirties the shared pages of a child.  Returns what reseeds, in a child, the generators these
    libraries seeded at import."""
    loaded = []
    with threading_stand_in():
        for name in modules:
            try:
                __import__(name)
                loaded.append(name)
            except Exception:
                pass
        for name in loaded:
            with contextlib.suppress(Exception):  # a warm-up is only an optimisation
                exec(WARMUPS.get(name, ""), {})
        if cells:
            ipython_shell.warm()
            importlib.import_module(f"{__package__}.guest")  # E2B's agent: every sandbox's session has it
    reseed = reseeder()
    gc.collect()
    gc.freeze()
    collapse_heap()
    return reseed


def reseeder() -> Callable[[], None]:
    """Made in the zygote, called in each child just forked, where every page it writes is a page
    copied: numpy's global generator gets OS entropy written straight over its Mersenne Twister's
    key (its `seed()` would build a SeedSequence through numpy's layers: ~120 page copies against
    ~30, `docs/performance.md`); any other its own `seed()`."""
    numpy_random = sys.modules.get("numpy.random")
    key = _mt19937_key(numpy_random) if numpy_random is not None else None
    loaded = [sys.modules[name] for name in RESEEDED_MODULES if name in sys.modules]
    seeded = [module for module in loaded if key is None or module is not numpy_random]

    def reseed() -> None:
        if key is not None:
            address, position = key
            filled = 0
            while filled < MT19937_KEY_BYTES:  # past 256 bytes a signal may cut a getrandom short
                count = libc.getrandom(address + filled, MT19937_KEY_BYTES - filled, 0)
                if count <= 0:
                    check(-1, "getrandom")
                filled += count
            position.value = MT19937_KEY_WORDS  # the next draw turns the whole new key
        for module in seeded:
            module.seed()

    return reseed


def _mt19937_key(numpy_random: types.ModuleType) -> Optional[tuple[int, ctypes.c_int]]:
    """The address of the key of numpy's global generator and its position in it, where numpy
    names that generator (1.25 and later) and it is the MT19937 its legacy functions draw from."""
    generator: Any = getattr(numpy_random, "get_bit_generator", lambda: None)()
    if type(generator).__name__ != "MT19937":
        return None
    numpy_random.seed()  # no cached normal value (legacy `randn`'s second draw) is left for every child to share
    address: int = generator.ctypes.state_address
    return address, ctypes.c_int.from_address(address + MT19937_KEY_BYTES)


@contextlib.contextmanager
def threading_stand_in() -> Iterator[None]:
    """While the libraries load, `threading` is a module that hands out the `_thread` lock
    types `threading` itself hands out (numpy.random only takes `Lock` and `RLock` from it).

    The real module registers a fork hook that rebuilds its thread state in every forked run,
    used or not.  Any other name read from the stand-in imports the real module then and
    forwards to it, so a library that needs more still gets it (and the hook).  The stand-in
    leaves `sys.modules` afterwards: a run that imports `threading` gets the real module."""
    if "threading" in sys.modules:
        yield
        return
    stand_in = types.ModuleType("threading", "verl-sf's stand-in while libraries load (see warmup.py)")
    stand_in.Lock = getattr(_thread, "lock", _thread.allocate_lock)  # type: ignore[attr-defined]
    stand_in.RLock = _thread.RLock  # type: ignore[attr-defined]
    stand_in.__getattr__ = _real_threading_attribute  # type: ignore[method-assign]
    sys.modules["threading"] = stand_in
    try:
        yield
    finally:
        if sys.modules.get("threading") is stand_in:
            del sys.modules["threading"]


def _real_threading_attribute(name: str) -> Any:
    """Put the real `threading` in the stand-in's place and read `name` from it (dunder names,
    which tools probe on every module, are answered as missing instead)."""
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)
    if getattr(sys.modules.get("threading"), "__getattr__", None) is _real_threading_attribute:
        del sys.modules["threading"]
    import threading
    return getattr(threading, name)


def collapse_heap() -> None:
    """Back the imported heap with huge pages: fork then copies far fewer page-table entries."""
    huge = 1 << 21
    try:
        with open("/proc/self/maps") as maps:
            regions = [line.split() for line in maps]
    except OSError:
        return
    for parts in regions:
        path = parts[5] if len(parts) > 5 else ""
        if "w" not in parts[1] or "p" not in parts[1] or path not in ("", "[heap]"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        start = (start + huge - 1) & ~(huge - 1)
        end &= ~(huge - 1)
        if end > start:
            libc.madvise(start, end - start, MADV_HUGEPAGE)
            libc.madvise(start, end - start, MADV_COLLAPSE)
