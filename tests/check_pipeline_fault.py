#!/usr/bin/env python3
"""Runs test_pipeline_processes_fault under `mpirun --enable-recovery -np 4` and judges it by
what the ranks print: with --enable-recovery Open MPI keeps the job alive when a process exits
(what the test needs: a stage leaves, the others must name it), but it then exits 0 whatever
the ranks' statuses, so the status cannot tell. Passes when rank 0's doctest summary says
SUCCESS, no rank printed a failure, and the job ended within its time.

  check_pipeline_fault.py MPIRUN TEST_BINARY [TEST_ARGS...]

TEST_ARGS (a doctest filter, -tc=...) choose the case: each case has a rank leave the job, so one
job runs one case.
"""
import os
import subprocess
import sys

mpirun, exe, args = sys.argv[1], sys.argv[2], sys.argv[3:]
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_hwloc_base_binding_policy="none")
try:
    r = subprocess.run([mpirun, "--enable-recovery", "-np", "4", exe] + args, capture_output=True, text=True, env=env, timeout=120)
except subprocess.TimeoutExpired:
    print("FAIL: the job did not end within 120 s (a hang)")
    sys.exit(1)
out = r.stdout + r.stderr
print(out)
ok = "Status: \x1b[0;32mSUCCESS!" in out or "Status: SUCCESS!" in out
# (Open MPI's own "PMIX ERROR: BAD-PARAM" notices about the process that left are not failures.)
bad = "FAILURE" in out or any("ERROR:" in line and "PMIX ERROR" not in line for line in out.splitlines())
if not ok or bad:
    print("FAIL: " + ("a rank reported a failure" if bad else "no doctest summary of success from rank 0"))
    sys.exit(1)
print("ok: every rank left named the process that exited")
