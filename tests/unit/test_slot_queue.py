"""The executor's idle-slot queue: FIFO for waiters, a warm flavor preferred among idle slots."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from verl_sf.executor.slot_queue import SlotQueue


def slot(name: str, *flavors: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, zygotes={"lean", *flavors})


def wants(flavor: str):
    return lambda candidate: flavor in candidate.zygotes


async def test_an_idle_slot_with_the_flavor_is_preferred_else_the_longest_idle() -> None:
    queue = SlotQueue()
    for s in (slot("a"), slot("b", "numpy"), slot("c")):
        queue.put(s)
    assert (await queue.get(wants("numpy"))).name == "b"
    assert (await queue.get(wants("sympy"))).name == "a"
    assert (await queue.get(wants("numpy"))).name == "c"
    assert not queue.has_idle()


async def test_waiters_are_served_in_arrival_order_whatever_their_flavor() -> None:
    queue = SlotQueue()
    order: list[str] = []

    async def take(tag: str, flavor: str) -> None:
        got = await queue.get(wants(flavor))
        order.append(f"{tag}:{got.name}")

    tasks = [asyncio.create_task(take(str(i), flavor)) for i, flavor in enumerate(["numpy", "lean", "sympy"])]
    await asyncio.sleep(0)
    queue.put(slot("x"))
    queue.put(slot("y", "sympy"))
    queue.put(slot("z", "numpy"))
    await asyncio.gather(*tasks)
    assert order == ["0:x", "1:y", "2:z"]


async def test_a_cancelled_waiter_neither_loses_a_slot_nor_blocks_the_next() -> None:
    queue = SlotQueue()
    first = asyncio.create_task(queue.get(wants("lean")))
    second = asyncio.create_task(queue.get(wants("lean")))
    await asyncio.sleep(0)
    first.cancel()
    queue.put(slot("only"))  # put() runs before the cancelled task resumes
    assert (await second).name == "only"
    assert first.cancelled()


async def test_a_waiter_cancelled_after_being_handed_a_slot_passes_it_on() -> None:
    queue = SlotQueue()
    first = asyncio.create_task(queue.get(wants("lean")))
    await asyncio.sleep(0)
    queue.put(slot("s"))  # handed to `first`, which is cancelled before it runs
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert queue.has_idle()
    assert (await queue.get(wants("lean"))).name == "s"
