"""Every exception the package raises is a `VerlSfError`, under the intermediate base that says
what kind of failure it is (as httpx's have them); the code that runs inside the sandbox, on the
standard library alone, is the one exception to it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import verl_sf
from verl_sf.errors import CapacityError, ConflictError, InputError, NotFoundError, SandboxFailure, VerlSfError

SANDBOX_SIDE = ("verl_sf.executor.zygote", "verl_sf.rewards.sandbox_harness")  # the standard library only


def package_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.walk_packages(verl_sf.__path__, "verl_sf."):
        if module_info.name.startswith(SANDBOX_SIDE):
            continue
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_exception_of_the_package_is_a_verl_sf_error() -> None:
    found = package_exceptions()
    assert len(found) > 40
    assert [name for name, kind in found.items() if not issubclass(kind, VerlSfError)] == []


def test_each_kind_has_its_base_and_keeps_its_standard_one() -> None:
    found = package_exceptions()
    kinds = {
        InputError: ("JsonBodyError", "BadCursor", "SourceRejected", "UnknownLanguage", "BadBody",
                     "InvalidRequest", "SandboxRequestRejected", "BodyTooLarge", "UndecodableBody"),
        NotFoundError: ("SessionGone", "SnapshotGone", "SandboxGone", "NotFound"),
        ConflictError: ("SessionBusy", "NotStarted", "NameTaken"),
        CapacityError: ("Overloaded", "TooManySandboxes"),
        SandboxFailure: ("ForkFailed",),
    }
    for base, names in kinds.items():
        for name in names:
            matches = [kind for full, kind in found.items() if full.rsplit(".", 1)[1] == name]
            assert matches, name
            assert all(issubclass(kind, base) for kind in matches), (name, base)
    assert issubclass(InputError, ValueError) and issubclass(NotFoundError, LookupError)
    assert issubclass(ConflictError, RuntimeError) and issubclass(CapacityError, RuntimeError)


def test_the_answer_table_takes_the_most_specific_entry() -> None:
    from verl_sf.e2b.sandboxes import SandboxGone
    from verl_sf.errors import ANSWERS, Overloaded, SessionBusy, SessionGone, answer_for, error_of

    assert answer_for(SessionGone("s", "ended")) == ANSWERS[SessionGone]
    assert answer_for(SandboxGone("x", "killed")) == ANSWERS[NotFoundError]  # by its base
    overloaded = answer_for(Overloaded("full"))
    assert overloaded is not None and (overloaded.status, overloaded.code, overloaded.retry_after) == (503, "overloaded", True)
    assert answer_for(KeyError("not ours")) is None
    rebuilt = error_of("session_busy", "a call is running", session_id="s")
    assert isinstance(rebuilt, SessionBusy) and rebuilt.reason == "a call is running"
    assert error_of("session_not_found", "gone") is None  # names no session: nothing to rebuild
