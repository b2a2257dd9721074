"""What the benchmarks run across emulated hosts share (multihost_allreduce.py,
pipeline_tensor_multihost.py): one job under scripts/multihost, and what their JSON says about
the machine and its load. Standard library only."""
import json
import os
import platform
import subprocess
import sys


def machine():
    """The CPU's model name, the cores, the kernel and Python's version."""
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}


def load():
    """The 1-minute load average."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_job(program, cmd, out_json, link_json):
    """Runs `cmd` (scripts/multihost ... --json LINK_JSON -- a program writing --json OUT_JSON):
    exits 77 where multihost cannot run (not root, no namespaces), exits naming the command
    where the job fails; returns (its stdout, the program's JSON, multihost's links)."""
    for f in (out_json, link_json):
        if os.path.exists(f):
            os.remove(f)
    env = dict(os.environ)
    env.update({"OMP_WAIT_POLICY": "passive", "STRATA_QUIET_BLAS": "1"})
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if r.returncode == 77:
        print(f"skipped: {r.stderr.strip()}")
        sys.exit(77)
    if r.returncode != 0 or not os.path.exists(out_json):
        sys.exit(f"{program}: {' '.join(cmd)}: exit {r.returncode}: {r.stdout[-1500:]} {r.stderr[-1500:]}")
    with open(out_json) as f:
        doc = json.load(f)
    with open(link_json) as f:
        links = json.load(f)["links"]
    return r.stdout, doc, links
