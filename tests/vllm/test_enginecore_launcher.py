"""vLLM's EngineCore as trioserve's child (``trioserve.enginecore.launcher``): usage errors
in one line with status 2, and the engine killed under load, with a real EngineCore of its
own (this test ends it).

Killed with SIGKILL, EngineCore says nothing; every request in flight must end at once with
one error each, the client must say the engine is lost, and the whole process tree must be
gone afterwards.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from tests.helpers.enginecore_session import ANSWER_GUARD, Collect, request
from tests.helpers.vllm_session import START_GUARD, VLLM_OPTIONS, vllm_cpus, vllm_env
from tests.helpers.waiting import wait_until
from trioserve.enginecore.launcher import open_child_engine
from trioserve.errors import CommandError, EngineLostError

pytestmark = pytest.mark.integration

PROMPT = [0, 57, 101, 33, 250, 7]


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                pending.append(child)
    return found


def title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def vllm_processes() -> set[int]:
    """Every process on the machine whose command line names vLLM."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and "vllm" in title(int(entry.name)).lower():
            found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize(
    ("model", "options", "line"),
    [
        ("/no/such/model", [], "the model directory /no/such/model does not exist"),
        (
            None,
            ["--max-model-len", "abc"],
            "vLLM's options: argument --max-model-len: invalid human_readable_int_or_auto "
            "value: 'abc'",
        ),
        (None, ["--no-such-option"], "vLLM's options: unrecognized arguments: --no-such-option"),
    ],
)
async def test_a_usage_error_is_one_line_and_status_2(tiny_model, model, options, line):
    python, model_dir = tiny_model
    with pytest.raises(CommandError) as caught:
        async with open_child_engine(
            model or str(model_dir), options, python=python, env=vllm_env()
        ):
            raise AssertionError("the engine started")
    assert (str(caught.value), caught.value.exit_status) == (line, 2)


async def test_an_engine_not_ready_in_time_is_one_line_status_1_and_its_tree_is_gone(tiny_model):
    python, model_dir = tiny_model
    # The session's own engines (vllm serve, the shared EngineCore) run beside this one:
    # only what this launcher started is looked for, wherever it was reparented to.
    before = vllm_processes()
    with pytest.raises(CommandError) as caught:
        async with open_child_engine(
            str(model_dir), VLLM_OPTIONS, python=python, env=vllm_env(), load_timeout=0.5
        ):
            raise AssertionError("the engine was ready within 0.5 s")
    assert str(caught.value).startswith("vLLM's EngineCore was not ready within 0.5 s")
    assert caught.value.exit_status == 1
    # The launcher SIGKILLed its group; the kernel takes a moment to tear it down.
    await wait_until(
        lambda: not any(alive(pid) for pid in vllm_processes() - before),
        "the launcher's tree to end",
    )


async def test_enginecore_killed_under_load_ends_every_request_once(tiny_model):
    python, model_dir = tiny_model
    sinks = [Collect() for _ in range(6)]
    tree: list[int] = []
    with pytest.raises(EngineLostError) as caught:
        async with open_child_engine(
            str(model_dir),
            VLLM_OPTIONS,
            python=python,
            cpus=vllm_cpus(),
            env=vllm_env(),
            load_timeout=START_GUARD,
        ) as engine:
            client = engine.client
            for index, sink in enumerate(sinks):
                client.add(request(f"r{index}", PROMPT, max_tokens=3000, ignore_eos=True), sink)
            with trio.fail_after(ANSWER_GUARD):
                for sink in sinks:
                    await sink.first.wait()
            tree = descendants(engine.process.pid)
            cores = [pid for pid in tree if "EngineCore" in title(pid)]
            assert len(cores) == 1, [(pid, title(pid)) for pid in tree]
            os.kill(cores[0], signal.SIGKILL)
            with trio.fail_after(ANSWER_GUARD):
                await trio.sleep_forever()  # the client's death cancels this
    reason = str(caught.value)
    # Every request in flight ended once, lost, with the reason the client gave.
    assert [sink.ends for sink in sinks] == [1] * len(sinks)
    assert {sink.lost_reason for sink in sinks} == {reason}
    assert all(sink.finish_reason is None for sink in sinks)
    assert client.failure == reason and client.in_flight == 0
    # ... and the tree is gone: the launcher, EngineCore's worker, all of it. (SIGKILLed
    # as a group when the context closed; a process holding gigabytes takes a moment to
    # be torn down by the kernel, so its end is waited for, under the hang guard.)
    assert not alive(engine.process.pid)
    await wait_until(lambda: not any(alive(pid) for pid in tree), "the engine's tree to end")
