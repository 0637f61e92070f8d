"""A gateway in a process of its own, for the exhaustion tests: the open-files limit set
as a user's shell would (``ulimit -n``), the mock upstream in the same loop.

    python gatewayproc.py NOFILE IDLE_TIMEOUT KEY

prints one JSON line ``{"port": ..., "token": ...}`` (a token granted for unit "u1"),
then each event of the gateway as a JSON line, and runs until its stdin closes.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys

from test_gateway import make_api

from fanout.events import Events
from fanout.gateway import Gateway

from mockapi import MockApi, MockConfig


def said(event: dict[str, object]) -> None:
    print(json.dumps(event), flush=True)


async def main(idle_timeout: float, key: str) -> None:
    async with MockApi(MockConfig(require_key=key)) as mock:
        gateway = Gateway(
            [make_api(mock.url)],
            {"anthropic": key},
            events=Events(said),
            stop=print,
            idle_timeout=idle_timeout,
        )
        await gateway.start()
        try:
            token = gateway.grant(unit="u1", attempt=1, deadline=1e12)
            said({"port": gateway.port, "token": token})
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, sys.stdin.read)
        finally:
            await gateway.close()


if __name__ == "__main__":
    nofile, idle, real_key = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    )
    asyncio.run(main(idle, real_key))
