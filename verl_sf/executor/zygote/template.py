"""The template: a copy of the warm zygote, made before any request, that forks every child.

The zygote relays every job's traffic (code, files, `envs` in; output and records out) through its
heap, and freed memory is not cleared: a child forked from it would hold earlier jobs' data, which
its code could read from its own memory.  So the zygote never forks a child itself.  It asks the
template, which holds no job's data and only ever receives the child's pipe ends and small orders,
and which forks with CLONE_PARENT (linux.sibling_fork): the child is the zygote's, to wait for
and reap as before.  Orders are answered in the order sent, a pid (or an error) each.
"""

from __future__ import annotations

import os
import socket
import traceback
from typing import NoReturn, TypedDict

from . import linux, metadata
from .child import Blueprint, Child, setup_failed
from .run_groups import Groups
from .wire import dumps, loads

TEMPLATE_NAME = b"verl-sf-templat"  # what `ps` shows (15 characters at most)
ORDER_BYTES = 4096  # an order is ~200 bytes of JSON
ORDER_FDS = 5  # job socket, stdout, stderr and fd 3 ends of the child, and a network namespace to join


class Order(TypedDict):
    """One child to fork: its sequence number (its name and uid on the landlock rung), its cgroups,
    whether it gets a root helper, and whether a network namespace comes with the descriptors."""

    sequence: int
    groups: Groups
    rooted: bool
    network: bool


class TemplateFailed(OSError):
    """The template could not fork a child (errno and text as the fork failed there)."""


class Template:
    """The zygote's side: orders out, pids back."""

    def __init__(self, blueprint: Blueprint, closed: list[int]):
        self.socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                self.socket.close()
                for fd in closed:
                    os.close(fd)
                if blueprint.metadata_confined:  # before any child: every run and session inherits it
                    metadata.send(theirs, metadata.install())
                _serve(theirs, blueprint)
            except BrokenPipeError:
                pass  # the zygote went first, its server stopping: no one is left to answer
            except BaseException:
                os.write(2, f"verl-sf: the zygote's template failed: {traceback.format_exc()}".encode())
            os._exit(1)
        theirs.close()
        self.metadata = metadata.receive(self.socket) if blueprint.metadata_confined else -1

    def order(self, order: Order, fds: list[int]) -> None:
        socket.send_fds(self.socket, [dumps(order)], fds)

    def answer(self) -> int:
        """The pid of the oldest child ordered and not yet answered (blocks until it is forked)."""
        message = self.socket.recv(4096)
        if not message:
            raise TemplateFailed(0, "the zygote's template exited (its error is in the server log)")
        if message.startswith(b"error "):
            number, _, text = message[6:].partition(b" ")
            raise TemplateFailed(int(number), f"a child could not be forked: {text.decode(errors='replace')}")
        return int(message)

    def close(self) -> None:
        self.socket.close()
        os.waitpid(self.pid, 0)


def _serve(channel: socket.socket, blueprint: Blueprint) -> NoReturn:
    """The template's loop: fork a child per order, until the zygote closes the channel.  Every page
    the template writes after a fork is a page the kernel copies, so it only forks: the child reads
    its order and reseeds its generators itself."""
    linux.set_name(TEMPLATE_NAME)
    linux.die_with_parent()
    fork = linux.sibling_fork(new_pid_namespace=blueprint.isolated)  # isolated: PID 1 of a brand-new namespace
    receive, send, close, ancillary = channel.recvmsg, channel.send, os.close, socket.CMSG_LEN(ORDER_FDS * 4)
    while True:
        message, control, _, _ = receive(ORDER_BYTES, ancillary)
        fds = memoryview(control[0][2]).cast("i").tolist() if control else []
        if not message:
            os._exit(0)
        try:
            pid = fork()
        except OSError as exc:
            send(b"error %d %s" % (exc.errno or 0, str(exc).encode()))
        else:
            if pid == 0:
                _child(message, fds, blueprint, channel)
            send(b"%d" % pid)
        for fd in fds:
            close(fd)


def _child(message: bytes, fds: list[int], blueprint: Blueprint, channel: socket.socket) -> NoReturn:
    child = None
    try:
        channel.close()
        blueprint.reseed()
        order: Order = loads(message.decode())
        job_r, out_w, err_w, meta_w, *network = fds
        groups: Groups = {controller: (base, name) for controller, (base, name) in order["groups"].items()}
        child = Child(blueprint, groups, order["sequence"], network[0] if order["network"] else -1, order["rooted"])
        child.setup(job_r, out_w, err_w, meta_w)
    except BaseException as exc:
        try:
            os.write(2, f"verl-sf: run setup failed: {traceback.format_exc()}".encode())
            setup_failed(child.job_fd if child else fds[0], exc)
        finally:
            os._exit(126)
