"""``python -m bench.member``: how many lock cycles one member (one ``redis-server``) takes, by
``redis-benchmark`` sending our own commands straight to one fresh local master, no client
library in the way:

- acquire: ``SET <key> <value> NX PX 60000`` on random keys (``-r``): the uncontended acquire;
- release: ``EVALSHA <RELEASE sha> 2 <key> <queue> <value> 1 <notice> <inbox prefix> ''``, the
  engine's release script, on keys that hold that value (filled beforehand; the share that hit
  a held key is printed: a miss is a GET and no DEL);
- for comparison, the classic compare-and-delete script of the bench's floor, on the same keys.

Each with 50 connections, unpipelined (``-P 1``) and pipelined 16 deep (``-P 16``: many
callers' requests on one connection, as the engine's shared pipe carries them under load).
Per command: requests/s from ``redis-benchmark``, the command's own time from ``INFO
commandstats`` (``usec_per_call``; a script's time includes what it calls) and the server's CPU
(``used_cpu_sys + used_cpu_user`` delta / calls: sockets and parsing included). redis-benchmark
runs on the other CPU of this 2-CPU machine. Never run by the test suite; it asserts nothing.
"""

from __future__ import annotations

import argparse
import subprocess
import time
from dataclasses import dataclass

from django_redlock.engine.scripts import plain as scripts
from django_redlock.testing.masters import LocalMaster, local_masters

from . import report
from .handoff import uptime

#: A value as long as ours (token + owner JSON: 138 bytes in bench (e)); no commas or quotes,
#: which would garble redis-benchmark's CSV line (it names the test by the command).
VALUE = ("0123456789abcdef" * 2 + ":owner:host-pid-thread-label:").ljust(138, "x")
FLOOR_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
)
KEYSPACE = 300_000


@dataclass
class Measured:
    what: str
    pipeline: int
    requests_per_s: float
    usec_per_call: float
    cpu_us_per_call: float
    hits: str = ""


def bench_command(port: int, n: int, pipeline: int, *command: str) -> float:
    """``redis-benchmark`` requests/s for ``command`` (with ``__rand_int__`` keys)."""
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-n", str(n), "-c", "50", "-P", str(pipeline),
         "-r", str(KEYSPACE), "--csv", *command],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    last = [line for line in out.splitlines() if line.startswith('"') and "rps" not in line][-1]
    return float(last.split(",")[1].strip('"'))


def fill(master: LocalMaster) -> None:
    """Every key of the keyspace holds ``VALUE`` (what a release hits)."""
    client = master.client()
    try:
        for start in range(0, KEYSPACE, 10_000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(start + 10_000, KEYSPACE)):
                pipe.set(f"bench:lock:{i:012d}", VALUE, px=600_000)
            pipe.execute()
    finally:
        client.close()


def measure(
    master: LocalMaster, what: str, n: int, pipeline: int, command: list[str], name: str
) -> Measured:
    client = master.client()
    try:
        client.config_resetstat()
        info = client.info("cpu")
        cpu = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
        rps = bench_command(master.port, n, pipeline, *command)
        info = client.info("cpu")
        cpu = float(info["used_cpu_sys"]) + float(info["used_cpu_user"]) - cpu
        stats = client.info("commandstats")
        mine = stats[f"cmdstat_{name}"]
        deleted = stats.get("cmdstat_del", {}).get("calls", 0)
    finally:
        client.close()
    calls = int(mine["calls"])
    hits = f"{deleted / calls:.0%} hit a held key" if name == "evalsha" else ""
    return Measured(what, pipeline, rps, float(mine["usec_per_call"]), cpu * 1e6 / calls, hits)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.member", description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000, help="per run (100000)")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error(f"--requests must be >= 1, got {args.requests}")
    started = time.monotonic()
    lines = [f"`{uptime()}`", ""]
    found: list[Measured] = []
    with local_masters(1) as (master,):
        client = master.client()
        release_sha = client.script_load(scripts.RELEASE.source)
        floor_sha = client.script_load(FLOOR_RELEASE)
        client.close()
        key = "bench:lock:__rand_int__"
        for pipeline in (1, 16):
            client = master.client()
            client.flushall()
            client.script_load(scripts.RELEASE.source)
            client.script_load(FLOOR_RELEASE)
            client.close()
            set_nx = ["SET", key, VALUE, "NX", "PX", "60000"]
            found.append(measure(master, "acquire: SET NX PX", args.requests, pipeline, set_nx,
                                 "set"))  # fmt: skip
            fill(master)
            ours = ["EVALSHA", release_sha, "2", key, "bench:queue", VALUE, "1",
                       "0123456789abcdef", "redlock:inbox:", ""]  # fmt: skip
            found.append(measure(master, "release: our RELEASE script", args.requests,
                                 pipeline, ours, "evalsha"))  # fmt: skip
            fill(master)
            classic = ["EVALSHA", floor_sha, "1", key, VALUE]
            found.append(measure(master, "release: the floor's compare-and-delete",
                                 args.requests, pipeline, classic, "evalsha"))  # fmt: skip
        lines.append(f"{report.environment('one master on 127.0.0.1')}.")
    lines.append("")
    headers = ["command", "pipeline", "requests/s", "commandstats us/call", "server CPU us/call"]
    headers.append("note")
    rows = [
        [m.what, str(m.pipeline), f"{m.requests_per_s:,.0f}", f"{m.usec_per_call:.2f}",
         f"{m.cpu_us_per_call:.2f}", m.hits]
        for m in found
    ]  # fmt: skip
    lines.append(report.table(headers, rows))
    lines.append("")
    for pipeline in (1, 16):
        acquire, release = (
            next(m for m in found if m.pipeline == pipeline and m.what.startswith(w))
            for w in ("acquire", "release: our")
        )
        cycle_cpu = acquire.cpu_us_per_call + release.cpu_us_per_call
        by_rps = 1 / (1 / acquire.requests_per_s + 1 / release.requests_per_s)
        lines.append(
            f"- pipeline {pipeline}: one member takes about {by_rps:,.0f} lock cycles/s "
            f"(acquire and release at redis-benchmark's rates, one after the other); by server "
            f"CPU, {cycle_cpu:.1f} us per cycle, {1e6 / cycle_cpu:,.0f} cycles/s per core."
        )
    lines.append("")
    lines.append(f"`{uptime()}`. Took {time.monotonic() - started:.0f} s.")
    text = "\n".join(lines)
    print(text)
    print(f"(saved to {report.save('member', text)})")


if __name__ == "__main__":
    main()
