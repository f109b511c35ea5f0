"""A registry of 100,000 adapters restored as an operator does it, on a Redis of its own:
`loragate registry import FILE` timed from the command's start to its exit (Python's start,
reading and checking the file, writing it), then `loragate serve` started on that registry,
timed to "ready" (listening, /health ok) and to its first answer about the last adapter
(GET /v1/adapters/<key>), beside the same server started on an empty registry.

`--busy N` runs N processes that spin on the CPU meanwhile ("other work running");
`--slow-rate` puts a proxy between the import and Redis that forwards that many bytes a
second (tests/slow_proxy_testlib.py). The issue's goals: import under 60 s, ready under 30.

    .venv/bin/python benchmarks/registry_import.py --adapters 100000 --busy 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from registry_scale import records, start_redis

from loragate.registry.api_keys import issue_api_key
from loragate.registry.backup_file import backup_lines
from loragate.registry.records import TenantQuota, TenantRecord
from loragate.registry.snapshot import RegistrySnapshot

ADMIN_KEY = "bench-admin-key-0123456789"
CLI = [sys.executable, "-m", "loragate.gateway.assembly.cli"]


def write_backup(path: Path, tenants: int, adapters: int) -> str:
    """The backup file; returns the last adapter's key."""
    made, stored = [], []
    for t in range(tenants):
        _, key = issue_api_key(f"t{t:04d}")
        stored.append(key)
        made.append(
            TenantRecord(
                name=f"t{t:04d}", quota=TenantQuota(), created_at=1.0, key_ids=(key.key_id,)
            )
        )
    every = tuple(records(tenants, adapters // tenants))
    snapshot = RegistrySnapshot(
        tenants=tuple(made), keys=tuple(stored), adapters=every, last_lora_int_id=len(every)
    )
    with open(path, "w", encoding="utf-8") as out:
        for line in backup_lines(snapshot, source="bench", exported_at=time.time()):
            out.write(line + "\n")
    return every[-1].key


def timed_import(path: Path, url: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [*CLI, "registry", "import", str(path), "--redis-url", url],
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the import failed: {done.stdout}{done.stderr}")
    print(done.stdout.splitlines()[0][:120])
    return elapsed


def timed_start(url: str, key: str | None, args, workdir: Path) -> tuple[float, float | None]:
    """Seconds from `loragate serve`'s start to ready, and to its answer about `key`."""
    command = [*CLI, "serve", "--port", "0", "--redis-url", url, "--admin-key", ADMIN_KEY]
    command += ["--model", args.model] if args.model else []
    log = open(workdir / "serve.log", "w")  # noqa: SIM115  (closed below)
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
    listening, where = threading.Event(), []

    def read():
        for line in proc.stdout:
            if "listening on" in line:
                where.append(line.split("listening on", 1)[1].strip())
                listening.set()
        listening.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        listening.wait(600)
        if not where:
            raise SystemExit(f"the server did not start; see {workdir / 'serve.log'}")
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        with httpx.Client(base_url=where[0], headers=headers, timeout=60) as client:
            while client.get("/health").json().get("status") != "ok":
                time.sleep(0.05)
            ready = time.perf_counter() - start
            if key is None:
                return ready, None
            shown = client.get(f"/v1/adapters/{key}")
            if shown.status_code != 200:
                raise SystemExit(f"the last adapter was not served: {shown.text}")
            return ready, time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def cpu() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line),
        "?",
    )
    flags = sorted(
        {f for line in open("/proc/cpuinfo") if line.startswith("flags") for f in line.split()}
    )
    return f"{model}, {os.cpu_count()} cores, {' '.join(f for f in flags if 'avx' in f)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--adapters", type=int, default=100_000)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU")
    p.add_argument("--slow-rate", type=float, default=None, help="bytes/s through a proxy")
    p.add_argument("--model", default=None, help="serve's --model (default: its default)")
    p.add_argument("--starts", type=int, default=2, help="server starts of each kind")
    args = p.parse_args()
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)
    ]
    proc, url = start_redis()
    empty_proc, empty_url = start_redis()
    proxy = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            last = write_backup(workdir / "backup.jsonl", args.tenants, args.adapters)
            target = url
            if args.slow_rate:
                sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
                from slow_proxy_testlib import SlowProxy

                proxy = SlowProxy(int(url.rsplit(":", 1)[1]), args.slow_rate).start()
                target = proxy.url
            imported = timed_import(workdir / "backup.jsonl", target)
            starts = []  # alternated, so that a change in the machine's load hits both
            for _ in range(args.starts):
                starts.append(("empty", *timed_start(empty_url, None, args, workdir)))
                starts.append(("full", *timed_start(url, last, args, workdir)))
    finally:
        if proxy is not None:
            proxy.stop()
        for server in (proc, empty_proc):
            server.terminate()
            server.wait(10)
        for spinner in spinners:
            spinner.kill()
    load = os.getloadavg()
    print(f"CPU: {cpu()}")
    print(f"load average at the end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    slowed = f", through a proxy at {args.slow_rate / 1e6:g} MB/s" if args.slow_rate else ""
    print(
        f"{args.adapters} adapters over {args.tenants} tenants, {args.busy} spinning "
        f"processes{slowed}"
    )
    print("| step | seconds |")
    print("|---|---|")
    print(f"| `loragate registry import` (start to exit) | {imported:.1f} |")
    for kind, ready, served in starts:
        if kind == "empty":
            print(f"| `loragate serve` ready, empty registry | {ready:.1f} |")
        else:
            print(f"| `loragate serve` ready, {args.adapters} adapters | {ready:.1f} |")
            print(f"| ... and its answer about the last adapter | {served:.1f} |")


if __name__ == "__main__":
    main()
