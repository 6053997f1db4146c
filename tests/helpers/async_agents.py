"""Async tools (``async def``) for the agent tests, loaded by name as a user's own would be."""

import asyncio
import threading

CANCELLED: list[str] = []  # the tools whose coroutine was cancelled past its deadline


async def pause() -> str:
    """Wait 50 ms without a thread, as a tool that awaits a service would, then answer."""
    await asyncio.sleep(0.05)
    return "ok"


async def where() -> str:
    """Answer with the name of the thread the tool runs in."""
    return threading.current_thread().name


async def hang(label: str) -> str:
    """Wait for an hour, noting it if cancelled.

    Args:
        label: What to note on cancellation.
    """
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        CANCELLED.append(label)
        raise
    return "never"


async def broken() -> str:
    """An async tool with a bug."""
    raise ValueError("async tool bug")


class AsyncCounter:
    """helpers.agents.Counter with every method a coroutine: reset, the tool and reward."""

    async def reset(self, row: dict) -> str:
        self.count = 0
        return f"Count to {row['ground_truth']}."

    async def increment(self, by: int) -> str:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        self.count += by
        return str(self.count)

    async def reward(self) -> float:
        return float(self.count)


async def exits() -> str:
    """A tool that ends the program as a careless library might."""
    raise SystemExit(3)


class AsyncStuck(AsyncCounter):
    """helpers.agents.Stuck, its ``reset`` a coroutine that awaits forever or exits on some rows."""

    async def reset(self, row: dict) -> str:
        if row["ground_truth"] == "hang":
            await asyncio.Event().wait()
        if row["ground_truth"] == "exit":
            raise SystemExit(1)
        return await super().reset(row)
