"""The shapes of the guest's answers (executor/zygote/guest.py), one per operation.

The guest runs in the sandbox's own interpreter, beside the sandbox's code, which can print an
answer of its own in the guest's place: what the server takes from an answer is checked here
first, so such an answer is the sandbox's own broken call, never a server error.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import TypeAdapter, ValidationError
from typing_extensions import NotRequired, TypedDict


class Entry(TypedDict):
    name: str
    type: str
    path: str
    size: int
    mode: int
    permissions: str
    owner: str
    group: str
    mtime_ns: int
    is_symlink: bool
    symlink_target: NotRequired[str]


class Written(TypedDict):
    name: str
    type: str
    path: str


class Read(TypedDict, total=False):
    data: str  # the file's bytes, base64, when small
    fetch: str  # else the path to fetch it by


class End(TypedDict):
    exit_code: int
    status: str


class Poll(TypedDict):
    stdout: str  # base64, as every stream is
    stderr: str
    end: NotRequired[End]


class Started(Poll):
    pid: int


class Running(TypedDict):
    pid: int
    cmd: str
    args: list[str]
    envs: dict[str, str]
    cwd: str


class Context(TypedDict):
    cwd: str


SHAPES: dict[str, TypeAdapter[Any]] = {
    "fs_stat": TypeAdapter(Entry), "fs_make_dir": TypeAdapter(Entry), "fs_move": TypeAdapter(Entry),
    "fs_list": TypeAdapter(list[Entry]), "fs_write": TypeAdapter(Written), "fs_read": TypeAdapter(Read),
    "proc_start": TypeAdapter(Started), "proc_poll": TypeAdapter(Poll), "proc_list": TypeAdapter(list[Running]),
    "ctx_create": TypeAdapter(Context),
}
"""Operations whose answer the server reads; the others' (removals, signals, restarts) it ignores."""


def checked(operation: str, answer: Any) -> Optional[str]:
    """What is wrong with `answer` as `operation`'s, or None when it has that operation's shape."""
    shape = SHAPES.get(operation)
    if shape is None:
        return None
    try:
        shape.validate_python(answer, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{'.'.join(str(part) for part in first['loc']) or 'the answer'}: {first['msg']}"
    return None
