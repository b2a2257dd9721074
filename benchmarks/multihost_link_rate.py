#!/usr/bin/env python3
"""What an emulated inter-host link of scripts/multihost carries: a TCP stream of 1 MiB sends
for --seconds from host 0 to host 1, the receiver counting bytes, for each --link rate.

    python3 benchmarks/multihost_link_rate.py [--links 1gbit,10gbit,none] [--seconds 3] [--json FILE]

Each rate is one job of `scripts/multihost --hosts 2 --per-host 1 --link RATE` running this
file again as its command: rank 1 receives on 10.213.0.2 (host 1's address), rank 0 sends to it
0.5 s later. Prints a table; --json FILE writes the same figures. Needs what scripts/multihost
needs (root, network namespaces, tc tbf, Open MPI): exits 77 without it.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

PORT = 5201
HOST1 = "10.213.0.2"
CHUNK = 1 << 20


def rank_role(seconds):
    """Run inside the job: rank 1 receives and prints the bytes it got; rank 0 sends."""
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))
    if rank == 1:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("0.0.0.0", PORT))
        srv.listen(1)
        srv.settimeout(30)
        conn, _ = srv.accept()
        got, start = 0, None
        while True:
            b = conn.recv(CHUNK)
            if not b:
                break
            if start is None:
                start = time.perf_counter()
            got += len(b)
        elapsed = time.perf_counter() - start if start else 0.0
        print(f"RECEIVED {got} {elapsed:.6f}", flush=True)
    elif rank == 0:
        time.sleep(0.5)
        s = socket.create_connection((HOST1, PORT), timeout=30)
        buf = b"\0" * CHUNK
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            s.sendall(buf)
        s.close()
    else:
        sys.exit("multihost_link_rate: run by scripts/multihost with 2 ranks")


def main():
    if "--rank-role" in sys.argv:
        rank_role(float(sys.argv[sys.argv.index("--rank-role") + 1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--links", default="1gbit,10gbit,none", help="comma-separated tc rates (or none)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if a.seconds <= 0:
        ap.error(f"--seconds must be > 0, got {a.seconds}")
    multihost = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "multihost")
    rows = []
    for link in [x for x in a.links.split(",") if x]:
        r = subprocess.run([sys.executable, multihost, "--hosts", "2", "--per-host", "1", "--link", link, "--deadline", "120",
                            "--", sys.executable, os.path.abspath(__file__), "--rank-role", str(a.seconds)],
                           capture_output=True, text=True)
        if r.returncode == 77:
            print(r.stderr.strip() or r.stdout.strip())
            return 77
        got = [line.split() for line in r.stdout.splitlines() if line.startswith("RECEIVED ")]
        if r.returncode != 0 or not got:
            sys.exit(f"--link {link}: exit {r.returncode}, no byte count:\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
        nbytes, secs = int(got[0][1]), float(got[0][2])
        rows.append({"link": link, "bytes": nbytes, "seconds": secs, "gbit_per_second": 8 * nbytes / secs / 1e9})
    print(f"{'--link':<10} {'measured':>14}")
    for row in rows:
        print(f"{row['link']:<10} {row['gbit_per_second']:>9.3f} Gbit/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "multihost_link_rate", "seconds": a.seconds, "load_average": os.getloadavg(),
                       "results": rows}, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
