"""The Ray transport end to end, over real Ray clusters on loopback (``raycluster``):
a whole ``fanout run``, ``fanout hosts check``, Ctrl-C, a node killed mid-run, a node
running another fanout, and a coordinator without ray.  (The conformance suite runs
over the same session cluster as transport "ray".)"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
from test_gateway_run import KEY, WORKER

import fanout
import fanout.transports.ray
from fanout import spec
from fanout.errors import EnvironmentProblem
from fanout.isolation.exposure import NOTHING, Handed
from fanout.isolation.place import Place
from fanout.run import where
from fanout.spec import Ray
from fanout.transports.ray import RayTransport
from fanout.transports.ray.facts import NodeReport, Opened

from helpers import cli
from mockapi import MockApi, Usage
from procs import marker, pids_with

FANOUT = [sys.executable, "-m", "fanout"]

pytestmark = pytest.mark.slow


def _job(
    tmp_path: Path, address: str, root: Path, *, units: int, script: str, extra: str = ""
) -> Path:
    items = ", ".join(f'{{ n = "{n:02d}" }}' for n in range(units))
    job = tmp_path / "job.toml"
    job.write_text(
        f"""
version = 1
name = "rayjob"
[inputs]
items = [{items}]
[units]
id = "u{{{{ unit.record.n }}}}"
collect = ["out.txt"]
[task]
command = ["sh", "-c", {json.dumps(script)}]
timeout = "120s"
[runtime]
maxConcurrentTasks = 8
{extra}
[runtime.ray]
address = "{address}"
sandboxRoot = "{root}"
"""
    )
    return job


def _report(job: Path) -> dict[str, Any]:
    (run,) = sorted((job.parent / ".fanout" / "runs").iterdir())
    units: dict[str, Any] = {}
    for line in (run / "report.json").read_text().splitlines():
        record = json.loads(line)
        if "unit" in record or "id" in record:
            units[record.get("unit") or record["id"]] = record
    return units


@pytest.fixture
def root(ray_cluster: Any, tmp_path: Path) -> Path:
    """A sandbox root of the test's own on the nodes (which are this machine)."""
    path: Path = ray_cluster.root / tmp_path.name
    path.mkdir()
    return path


def test_a_job_runs_over_both_nodes_and_collects_its_files(
    ray_cluster: Any, root: Path, tmp_path: Path
) -> None:
    job = _job(
        tmp_path,
        ray_cluster.address,
        root,
        units=8,
        script='echo "$FANOUT_UNIT_ID" > out.txt; sleep 1; echo done',
    )
    ran = _fanout("run", str(job))
    assert ran.returncode == 0, ran.stdout
    assert "8 succeeded" in ran.stdout
    collected = sorted((tmp_path / ".fanout" / "runs").glob("*/units/*/out.txt"))
    assert len(collected) == 8
    assert sorted(p.read_text() for p in collected) == [f"u{n:02d}\n" for n in range(8)]
    events = [
        json.loads(line)
        for line in next((tmp_path / ".fanout" / "runs").glob("*/events.jsonl"))
        .read_text()
        .splitlines()
    ]
    hosts = {e["host"] for e in events if e["event"] == "attempt.placed"}
    assert len(hosts) == 2  # 8 units of 1 CPU at once on two nodes of 4 CPUs
    assert list(root.iterdir()) == []


def test_hosts_check_reports_every_node(ray_cluster: Any, root: Path, tmp_path: Path) -> None:
    job = _job(tmp_path, ray_cluster.address, root, units=1, script="true")
    ran = _fanout("hosts", "check", str(job))
    assert ran.returncode == 0, ran.stdout
    rows = [line for line in ran.stdout.splitlines() if "/" in line and "yes" in line]
    assert len(rows) == 2, ran.stdout
    second = next(row for row in rows if "zone=b" in row)
    assert "second 100" in second
    for row in rows:
        assert "CPU 4" in row
        assert "0.1.0" in row
        assert "pid-namespace (bwrap)" in row


def test_ctrl_c_leaves_no_process_and_no_sandbox(
    ray_cluster: Any, root: Path, tmp_path: Path
) -> None:
    token = marker()
    job = _job(tmp_path, ray_cluster.address, root, units=6, script=f"sleep {token}")
    running = subprocess.Popen(
        [*FANOUT, "run", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "240"},
    )
    try:
        deadline = time.monotonic() + 120
        while len(_sleeping(token)) < 6:
            assert time.monotonic() < deadline, "the units never started"
            assert running.poll() is None, running.communicate()[0]
            time.sleep(0.1)
        assert len(list(root.iterdir())) == 6
        running.send_signal(signal.SIGINT)
        output, _ = running.communicate(timeout=120)
    finally:
        if running.poll() is None:
            running.kill()
    assert running.returncode == 130, output
    assert "interrupted: running units were stopped and their sandboxes removed" in output
    assert (pids_with(token), list(root.iterdir())) == ([], [])


def test_a_node_killed_mid_run_loses_its_attempts_and_every_unit_settles_once(
    tmp_path: Path, own_ray_cluster: Any
) -> None:
    cluster = own_ray_cluster  # its own: this test kills a node of it
    root = cluster.root
    side = tmp_path / "side"
    side.mkdir()
    token = marker()
    # The side effect comes after the sleep: an attempt killed with its node never
    # does it, and a unit run to its end twice would do it twice.
    script = f'sleep {token} & wait; echo done >> "{side}/$FANOUT_UNIT_ID"; echo ok > out.txt'
    # Sandbox none: the side effects go outside the sandbox (bwrap's /tmp is its own).
    job = _job(tmp_path, cluster.address, root, units=12, script=script, extra='sandbox = "none"')
    running = subprocess.Popen(
        [*FANOUT, "run", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "240"},
    )
    try:
        deadline = time.monotonic() + 120
        while len(_sleeping(token)) < 8:  # four on each node
            assert time.monotonic() < deadline, "the units never started"
            assert running.poll() is None, running.communicate()[0]
            time.sleep(0.1)
        cluster.kill_node(cluster.nodes[1])
        # The head's four finish: stop their sleeps, so the rest of the run is quick.
        time.sleep(1)
        for pid in _sleeping(token):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 240
        while running.poll() is None:
            for pid in _sleeping(token):
                os.kill(pid, signal.SIGTERM)
            assert time.monotonic() < deadline, "the run did not end"
            time.sleep(0.2)
        output = running.communicate()[0]
    finally:
        if running.poll() is None:
            running.kill()
    assert running.returncode == 0, output
    assert "12 succeeded" in output
    assert {p.name: p.read_text() for p in side.iterdir()} == {
        f"u{n:02d}": "done\n" for n in range(12)
    }
    events = [
        json.loads(line)
        for line in next((tmp_path / ".fanout" / "runs").glob("*/events.jsonl"))
        .read_text()
        .splitlines()
    ]
    lost = [e for e in events if e["event"] == "attempt.finished" and e.get("status") == "lost"]
    assert len(lost) >= 4, output
    assert pids_with(token) == []


def test_a_node_with_another_fanout_is_refused(
    ray_cluster: Any, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout.transports.ray.transport, "__version__", "9.9.9")
    transport = RayTransport(Ray(address=ray_cluster.address, sandbox_root=str(root)), slots=1)

    async def started() -> None:
        try:
            await transport.start()
        finally:
            await transport.close()

    with pytest.raises(EnvironmentProblem) as caught:
        asyncio.run(started())
    assert str(caught.value).endswith(
        "runs fanout 0.1.0 and this coordinator 9.9.9: install fanout==9.9.9 in the nodes' image"
    )


def test_without_ray_a_ray_job_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if not installed
    monkeypatch.delitem(sys.modules, "fanout.transports.ray.rayapi", raising=False)
    monkeypatch.delattr(fanout.transports.ray, "rayapi", raising=False)
    transport = RayTransport(Ray(address="127.0.0.1:1"), slots=1)
    with pytest.raises(EnvironmentProblem) as caught:
        asyncio.run(transport.start())
    assert str(caught.value) == (
        "runtime.ray needs Ray, which is not installed here: pip install 'fanout[ray]'"
    )


def _fanout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*FANOUT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "240"},
    )


def _sleeping(token: str) -> list[int]:
    found = []
    for pid in pids_with(token):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{token}\0".encode():
                found.append(pid)
        except OSError:
            pass
    return found


def test_workers_on_the_nodes_reach_the_api_gateway(
    ray_cluster: Any,
    root: Path,
    tmp_path: Path,
    mock_api: MockApi,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job with [[apis]] on Ray: each worker reaches the coordinator's gateway at
    runtime.ray.gatewayHost (loopback: the nodes are this machine) with its attempt's
    token, and the upstream sees the real key only."""
    monkeypatch.setenv("FANOUT_TEST_ANTHROPIC_KEY", KEY)
    mock_api.configure(limit=100, window=1.0, require_key=KEY, usage=Usage(input_tokens=30))
    job = _job(
        tmp_path,
        ray_cluster.address,
        root,
        units=4,
        script="true",
        extra="network = true",
    )
    text = job.read_text().replace(
        'command = ["sh", "-c", "true"]', f"command = {json.dumps(['python3', '-c', WORKER, '2'])}"
    )
    text = text.replace('collect = ["out.txt"]', 'collect = ["seen.txt"]')
    text += f"""
[[apis]]
name = "anthropic"
upstream = "{mock_api.url}"
style = "anthropic"
keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
requests = {{ limit = 100, per = "1s" }}
"""
    job.write_text(text)
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    posts = mock_api.posts()
    assert [p.status for p in posts] == [200] * 8
    assert {p.key for p in posts} == {KEY}
    seen = [
        json.loads(p.read_text().splitlines()[0])
        for p in (tmp_path / ".fanout" / "runs").glob("*/units/*/seen.txt")
    ]
    assert len(seen) == 4
    assert all(s["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:") for s in seen)
    assert all(s["ANTHROPIC_API_KEY"] != KEY for s in seen)


class _Actor:
    """A stand-in for ``rayapi.Actor`` that records the memory each was placed with."""

    placed: ClassVar[list[int | None]] = []

    def __init__(self, placement: Any) -> None:
        self.placed.append(placement.memory)

    async def open(self, opening: Any) -> Opened:
        place = Place(host="node", kind="none", base="/tmp/x", path="/usr/bin:/bin")
        return Opened(version=fanout.__version__, node="node", node_id="n1", pid=1, place=place)

    def kill(self) -> None:
        pass


class _NodeActor:
    """An actor as the coordinator speaks to it (``rayapi.Actor``), served by a real
    ``node.NodeSandbox`` in this process (no Ray): each call is counted."""

    calls: ClassVar[list[str]] = []

    def __init__(self, placement: Any) -> None:
        from fanout.transports.ray.node import NodeSandbox

        self._node = NodeSandbox("0123abcd", "127.0.0.1")

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._node, name)
        self.calls.append(name)
        return method

    def kill(self) -> None:
        self.calls.append("kill")


async def test_a_warm_actor_runs_an_attempt_in_one_call_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    # A logic test at the seam (the node's side is the real one, in this process): an
    # attempt on a warm actor is one call, its step's, which makes the sandbox, stages
    # the files, runs the step, brings back the control file and removes the sandbox
    # before it answers; a new actor adds the call that asks its node's facts.  Today's
    # code made three (open, run, close).
    from fanout.attempt.sandbox import StagedFile

    from helpers import make_attempt

    root = tmp_path / "boxes"
    transport = RayTransport(Ray(sandbox_root=str(root)), slots=1, sandbox_kind="none")
    transport._api = types.SimpleNamespace(  # type: ignore[assignment]
        Actor=_NodeActor, Placement=types.SimpleNamespace
    )
    (tmp_path / "in.txt").write_text("staged\n")
    staged = (StagedFile(path="in.txt", source=tmp_path / "in.txt"),)
    script = 'cat in.txt; echo \'{"throttle": true}\' > "$FANOUT_CONTROL"'
    _NodeActor.calls = []
    try:
        for n in range(2):
            attempt = make_attempt(tmp_path / f"a{n}", ["sh", "-c", script], staged=staged)
            result = await transport.run(attempt)
            assert (result.output_tail, sorted(p.name for p in root.iterdir())) == (
                "staged\n",
                [],
            )
        assert _NodeActor.calls == ["open", "step", "step"]
        # A verify is a call of its own; files to collect ask for the listing, the
        # files and the sandbox's removal after the last step.
        _NodeActor.calls = []
        attempt = make_attempt(
            tmp_path / "a2", ["sh", "-c", "echo hi > out.txt"], verify=["true"], collect=["*.txt"]
        )
        result = await transport.run(attempt)
        assert [c.path for c in result.collected] == ["out.txt"]
        assert _NodeActor.calls == ["step", "step", "listing", "fetch", "close"]
        assert sorted(p.name for p in root.iterdir()) == []
    finally:
        await transport.close()


async def test_an_auto_sandbox_root_is_chosen_on_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # runtime.ray.sandboxRoot = "auto" (the default): each node chooses as a local run
    # does, by its own environment (here its TMPDIR); before, the nodes used /tmp.
    from helpers import make_attempt

    chosen = tmp_path / "node-tmp"
    chosen.mkdir()
    monkeypatch.setenv("TMPDIR", str(chosen))
    transport = RayTransport(Ray(), slots=1, sandbox_kind="none")
    assert transport._ray.sandbox_root == "auto"
    transport._api = types.SimpleNamespace(  # type: ignore[assignment]
        Actor=_NodeActor, Placement=types.SimpleNamespace
    )
    try:
        result = await transport.run(make_attempt(tmp_path / "a", ["sh", "-c", "pwd -P"]))
        assert Path(result.output_tail.strip()).parent.parent == chosen.resolve()
    finally:
        await transport.close()


async def test_each_attempt_asks_ray_for_its_own_memory() -> None:
    # A logic test (Ray's own placement is the real clusters' business): an attempt's
    # actor asks Ray for the attempt's memory (task.memory, or its rung's), and an idle
    # actor is only reused by an attempt allocated the same.
    _Actor.placed = []
    transport = RayTransport(Ray(), slots=2)
    transport._api = types.SimpleNamespace(  # type: ignore[assignment]
        Actor=_Actor, Placement=types.SimpleNamespace
    )
    small, opened = await transport._open(1 << 30)
    transport._keep(small, 1 << 30, opened)
    await transport._open(4 << 30)  # the next rung's: a new actor
    again, _ = await transport._open(1 << 30)  # the small one, idle
    assert again is small
    assert _Actor.placed == [1 << 30, 4 << 30]
    await transport.close()


class _Gated(_Actor):
    """A stand-in for ``rayapi.Actor`` whose start (its ``open``) ends when the test
    opens its gate, with its node's facts or with ``failure``."""

    made: ClassVar[list[_Gated]] = []

    def __init__(self, placement: Any) -> None:
        super().__init__(placement)
        self.gate = asyncio.Event()
        self.failure: BaseException | None = None
        self.killed = False
        self.made.append(self)

    async def open(self, opening: Any) -> Opened:
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        return await super().open(opening)

    def kill(self) -> None:
        self.killed = True


async def _two_waiting() -> tuple[
    RayTransport, asyncio.Task[Any], asyncio.Task[Any], _Gated, _Gated
]:
    """A transport of two slots whose actors are ``_Gated``, and two attempts waiting
    for an actor, each of which has asked Ray for one: the transport, the two attempts
    and the two actors, in the order asked."""
    _Gated.made = []
    transport = RayTransport(Ray(), slots=2)
    transport._api = types.SimpleNamespace(  # type: ignore[assignment]
        Actor=_Gated, Placement=types.SimpleNamespace
    )
    first = asyncio.ensure_future(transport._open(None))
    second = asyncio.ensure_future(transport._open(None))
    await _settle()
    one, two = _Gated.made
    return transport, first, second, one, two


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_an_attempt_takes_the_first_actor_free_not_only_its_own() -> None:
    # A logic test: the attempts waiting for actors are served first come, first
    # served, by whichever actor is free first (a new one started, or one another
    # attempt left), so no attempt waits on its own actor's start (a worker process,
    # seconds; or an autoscaler's node) while another actor is free.  Before, each
    # attempt waited for the actor it had asked Ray for.
    transport, first, second, one, two = await _two_waiting()
    try:
        two.gate.set()  # the second attempt's actor starts first
        await _settle()
        assert (first.done(), second.done()) == (True, False)
        actor, opened = first.result()
        assert cast(Any, actor) is two
        transport._hand(actor, None, opened)  # the first attempt left it cleanly
        await _settle()
        assert (second.done(), one.gate.is_set()) == (True, False)
        assert second.result()[0] is two
        # The other start, which no attempt waits for any more, is idle once it is
        # in; a third attempt takes it and asks Ray for nothing more.
        one.gate.set()
        await _settle()
        third, _ = await transport._open(None)
        assert (cast(Any, third), len(_Gated.made)) == (one, 2)
    finally:
        await transport.close()


async def test_a_start_that_fails_fails_an_attempt_only_when_no_other_start_is_on_its_way() -> None:
    from fanout.attempt.sandbox import Lost
    from fanout.transports.ray.facts import Gone

    transport, first, second, one, two = await _two_waiting()
    try:
        one.failure = Gone("the node died")
        one.gate.set()
        await _settle()
        # Two attempts wait and one start is left: the last attempt is lost.
        assert (first.done(), type(second.exception()), one.killed) == (False, Lost, True)
        assert "the node died" in str(second.exception())
        two.gate.set()
        assert cast(Any, (await first)[0]) is two
    finally:
        await transport.close()


async def test_a_cancelled_wait_stops_the_start_nobody_waits_for_and_close_stops_the_rest() -> None:
    transport, first, second, one, two = await _two_waiting()
    second.cancel()  # its deadline, or Ctrl-C, while Ray places the actors
    await _settle()
    assert (one.killed, two.killed) == (False, True)
    first.cancel()
    await _settle()
    assert one.killed
    third = asyncio.ensure_future(transport._open(None))
    await _settle()
    await transport.close()
    assert (len(_Gated.made), _Gated.made[-1].killed) == (3, True)
    third.cancel()


def test_a_node_must_offer_the_most_memory_any_rung_asks(tmp_path: Path) -> None:
    job = _job(tmp_path, "auto", tmp_path / "root", units=1, script="true")
    job.write_text(
        job.read_text().replace('timeout = "120s"\n', 'timeout = "120s"\nmemory = "1GiB"\n')
        + '[[retry.ladder]]\nname = "small"\n[[retry.ladder]]\nname = "big"\nmemory = "3GiB"\n'
    )
    transport = where.transport_for(spec.load(job), {}, notice=lambda message: None)
    assert isinstance(transport, RayTransport)
    assert transport._memory == 3 << 30


def test_plan_says_the_units_run_on_the_cluster_and_what_each_holds(tmp_path: Path) -> None:
    job = _job(tmp_path, "head:6379", tmp_path / "root", units=2, script="true")
    job.write_text(
        job.read_text()
        .replace('timeout = "120s"\n', 'timeout = "120s"\nmemory = "2GiB"\n')
        .replace('address = "head:6379"', 'address = "head:6379"\nresources = { agent = 1 }')
    )
    ran = cli("plan", str(job))
    assert ran.code == 0, ran.err
    (workers,) = [line for line in ran.out.splitlines() if line.startswith("Workers")]
    assert workers == (
        "Workers   8 at once on head:6379's Ray cluster (1 CPU, agent = 1, 2GiB a unit),"
        " sandbox auto (bwrap where a node has it), no network"
    )


def _plain_cluster(handed: Handed) -> RayTransport:
    """A transport whose cluster (a stand-in for rayapi) has one live node, without
    bwrap, running this fanout."""
    report = NodeReport(
        node="10.0.0.2/0123abcd", node_id="0123abcd", address="10.0.0.2", alive=True
    )

    async def facts(node_id: str) -> tuple[str, bool, str]:
        return fanout.__version__, False, "process group only"

    transport = RayTransport(Ray(), slots=1, handed=handed)
    transport._api = types.SimpleNamespace(  # type: ignore[assignment]
        connect=lambda address: None, nodes=lambda: [report], facts=facts
    )
    return transport


async def test_auto_on_nodes_without_bwrap_refuses_a_job_that_hands_out_tokens() -> None:
    # A logic test: the nodes' facts are what a probe there would say.  Plain
    # directories on a node let each worker read the other units' tokens (exposure).
    with pytest.raises(EnvironmentProblem) as caught:
        await _plain_cluster(Handed(tokens=True)).start()
    assert str(caught.value) == (
        "no node of the Ray cluster has a working bwrap (10.0.0.2/0123abcd): its units would"
        " run in plain directories, which do not hide the coordinator, the other units or"
        " this user's files from a worker: it could read the other running units' API tokens"
        " in /proc and keep them wherever its user can write; install bubblewrap on the"
        " nodes, or set runtime.unsandboxedSecrets = true to accept that"
    )
    # Handing out nothing, the same cluster runs units in plain directories.
    plain = _plain_cluster(NOTHING)
    await plain.start()
    assert plain._kind == "auto"
    # And when it does, a node is asked for bwrap, which one without it refuses.
    assert _plain_cluster(Handed(secrets=True))._kind == "bwrap"


async def test_no_cluster_to_join_says_how_to_start_one() -> None:
    def connect(address: str) -> None:  # what ray.init raises with no cluster to join
        raise ConnectionError(
            "Could not find any running Ray instance. Please specify the one to connect to"
            " by setting `--address` flag or `RAY_ADDRESS` environment variable."
        )

    transport = RayTransport(Ray(), slots=1)
    transport._api = types.SimpleNamespace(connect=connect)  # type: ignore[assignment]
    with pytest.raises(EnvironmentProblem) as caught:
        await transport.start()
    assert str(caught.value) == (
        "cannot join the Ray cluster at auto: no Ray cluster runs on this machine: start one"
        " (`ray start --head`) or set runtime.ray.address to its head's HOST:PORT"
    )


def test_staged_files_go_to_the_node_in_pieces_whole_and_with_their_bits(
    ray_cluster: Any, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pieces of 1,000 bytes: a file of 2,500 is three, a read-only one of 1,500 two (the
    # second appended to a file whose bits forbid it), an empty one still one.
    monkeypatch.setattr(fanout.transports.ray.transport, "STAGE_BATCH", 1000)
    files = {"big.bin": os.urandom(2500), "ro.txt": b"r" * 1500, "empty.txt": b""}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "ro.txt").chmod(0o444)
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tmp_path / "run.sh").chmod(0o755)
    script = "sha256sum big.bin ro.txt empty.txt > out.txt; stat -c %a ro.txt >> out.txt; ./run.sh >> out.txt"
    job = _job(tmp_path, ray_cluster.address, root, units=1, script=script)
    job.write_text(
        job.read_text().replace(
            'collect = ["out.txt"]',
            'collect = ["out.txt"]\nstage = ["big.bin", "ro.txt", "empty.txt", "run.sh"]',
        )
    )
    from fanout.transports.ray import rayapi

    # The bytes of each call's pieces, as the coordinator sends them: the last batch
    # rides with the step's call.
    sent: list[tuple[str, int]] = []
    stage, step = rayapi.Actor.stage, rayapi.Actor.step

    async def staged(self: Any, token: str, pieces: Any) -> None:
        sent.append(("stage", sum(len(piece[-1]) for piece in pieces)))
        await stage(self, token, pieces)

    async def stepped(self: Any, token: str, command: Any, *rest: Any) -> Any:
        sent.append(("step", sum(len(piece[-1]) for piece in rest[1])))
        return await step(self, token, command, *rest)

    monkeypatch.setattr(rayapi.Actor, "stage", staged)
    monkeypatch.setattr(rayapi.Actor, "step", stepped)
    monkeypatch.chdir(tmp_path)
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    # 2,500 + 1,500 + 0 + 19 bytes, by 1,000.
    assert sent == [("stage", 1000)] * 4 + [("step", 19)]
    (out,) = (tmp_path / ".fanout" / "runs").glob("*/units/*/out.txt")
    sums = [f"{hashlib.sha256(data).hexdigest()}  {name}" for name, data in files.items()]
    assert out.read_text().splitlines() == [*sums, "444", "ran"]


def test_a_killed_actors_sandbox_is_removed_on_its_node_as_a_local_run_would(
    tmp_path: Path,
) -> None:
    """``node.remove`` (the task pinned to a killed actor's node) removes any tree and
    sets aside, said, what it cannot: the same ``local.clear`` a run's start uses."""
    from fanout.transports.ray import node

    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    deep = tmp_path / f"fanout-{pid}-deep"
    subprocess.run(
        ["sh", "-c", "mkdir -p $(printf 'work/d/%.0s' $(seq 1000)) && chmod 000 work/d", "sh"],
        cwd=tmp_path,
        check=True,
    )
    (tmp_path / "work").rename(deep)
    try:
        assert node.remove(str(deep), pid) == []
    finally:  # pytest's own clean-up is shutil.rmtree's, which stops at a deep tree
        subprocess.run(["rm", "-rf", str(deep)], check=True)
    mounted = tmp_path / f"fanout-{pid}-mounted"
    (mounted / "m").mkdir(parents=True)
    aside = tmp_path / f"fanout-unremovable-{pid}-mounted"
    subprocess.run(["mount", "--bind", str(tmp_path), str(mounted / "m")], check=True)
    try:
        said = node.remove(str(mounted), pid)
    finally:
        subprocess.run(["umount", str((aside if aside.exists() else mounted) / "m")], check=True)
    assert said == [
        f"cannot remove {aside}: 'm' is a mount point; no fanout run touches it again,"
        f" remove it with: umount {aside}/m && rm -rf {aside}"
    ]
    assert sorted(path.name for path in tmp_path.iterdir()) == [aside.name]


def test_a_nodes_relay_keeps_at_most_its_bound_and_says_what_it_dropped() -> None:
    from fanout.transports.ray.node import Relay

    relay = Relay(most=10)
    relay.feed(b"0123456789")
    relay.feed(b"abcdef")  # 6 over: the oldest 6 go
    assert relay.take() == (
        b"\n[fanout: the node dropped 6 bytes of output here: the coordinator had not"
        b" taken them yet]\n6789abcdef"
    )
    relay.feed(b"xyz")
    assert relay.take() == b"xyz"  # said once


def test_a_step_that_prints_faster_than_the_coordinator_takes_it_is_bounded_on_the_node(
    ray_cluster: Any, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 64 MiB printed at once; the coordinator takes a chunk (1 MiB) every 50 ms: the
    # generator holds 8 in flight, the node's relay 16 MiB, and the rest is dropped
    # there, said in the log; the step's last words still arrive.
    from fanout.attempt.capture import OutputCapture

    feed = OutputCapture.feed

    def slow(self: OutputCapture, data: bytes) -> None:
        time.sleep(0.05)
        feed(self, data)

    monkeypatch.setattr(OutputCapture, "feed", slow)
    script = "head -c 67108864 /dev/zero | tr '\\0' x; echo; echo the end"
    job = _job(tmp_path, ray_cluster.address, root, units=1, script=script)
    text = job.read_text().replace('collect = ["out.txt"]', "collect = []")
    job.write_text(text.replace("[runtime]\n", '[runtime]\nlogLimit = "100MiB"\n', 1))
    monkeypatch.chdir(tmp_path)
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    (log,) = (tmp_path / ".fanout" / "runs").glob("*/logs/*/r1-a1.log")
    logged = log.read_bytes()
    assert b"[fanout: the node dropped " in logged
    assert logged.rstrip().endswith(b"the end")
    assert len(logged) < 64 << 20
