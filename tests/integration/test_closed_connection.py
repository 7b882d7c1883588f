"""A call on a closed connection raises outrig.CallCancelledError (an OutrigError, as every error a
call raises), over the Mux stream and as a unary call, from the blocking and the asyncio SDK, and
from a space made on that connection with `with_space`."""

from __future__ import annotations

import pytest

import outrig
import outrig.aio

from ..conftest import ServerProcess
from .entries import Task


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
def test_a_closed_space_raises_call_cancelled(server: ServerProcess, space_name: str, mux: bool) -> None:
    space = outrig.connect(server.address, space=space_name, mux=mux)
    other = space.with_space(f"{space_name}-other")
    space.write(Task(job="before"))
    space.close()
    for closed in (space, other):
        with pytest.raises(outrig.CallCancelledError, match="the connection is closed"):
            closed.write(Task(job="after"))
        with pytest.raises(outrig.CallCancelledError):
            closed.take_nowait(Task())


@pytest.mark.parametrize("mux", [True, False], ids=["mux", "unary"])
async def test_a_closed_async_space_raises_call_cancelled(
    server: ServerProcess, space_name: str, mux: bool
) -> None:
    space = outrig.aio.connect(server.address, space=space_name, mux=mux)
    other = space.with_space(f"{space_name}-other")
    await space.write(Task(job="before"))
    await space.close()
    for closed in (space, other):
        with pytest.raises(outrig.CallCancelledError, match="the connection is closed"):
            await closed.write(Task(job="after"))
