"""Custom judgers used by the tests, loaded by name as a user's own would be."""

import asyncio
import time


def exact(prompt, response, gold, row):
    return 1.0 if response.strip() == gold else 0.0


async def exact_async(prompt, response, gold, row):
    await asyncio.sleep(0)
    return {"score": 1.0 if response.strip() == gold else 0.0, "length": len(response)}


def broken(prompt, response, gold, row):
    raise RuntimeError("judger bug")


def sleepy(prompt, response, gold, row):
    time.sleep(30)
    return 1.0


def wordy(prompt, response, gold, row):
    return "yes"


def length(prompt, response, gold, row):
    return float(len(response))


def not_a_number(prompt, response, gold, row):
    return float("nan")


def infinite(prompt, response, gold, row):
    return {"score": float("-inf")}


def absurd(prompt, response, gold, row):
    return 1e308
