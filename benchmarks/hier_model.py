#!/usr/bin/env python3
"""The two-level cost model of the hierarchical all-reduce (docs/scaling.md, "Two levels"),
checked against bench_mpi_allreduce on this machine.

  hier_model.py --bench build/benchmarks/bench_mpi_allreduce [--mpirun mpirun] [--sizes-mb 16,64]
                [--reps 5] [--cores N] [--json FILE]

1. Calibrates each level alone with 2 processes (mpirun -np 2): "strata shm" is the intra-host
   stage of g = 2 ranks, "strata mpi" the cross-host stage of m = 2 leaders.
2. Measures 4 processes declared to be 2 hosts x 2 (the benchmark's --fake-hosts 2): the flat
   transports and "strata hier", with its cross-host stage timed on rank 0.
3. Predicts the hierarchical time from the levels:
       T_hier(g x m, n) = s_in * (T_shm(g, n) + T_bcast(g, n)) + s_x * T_mpi(m, n)
   with T_bcast(g, n) = T_shm(g, n) * beta / (beta + gamma * (g-1)/g)   (the broadcast moves the
   bytes of the all-reduce's exchange but adds nothing), gamma / beta from docs/scaling.md,
   and the share factors of a machine with C cores: s_in = max(1, g*m / C) (every rank of
   every host works in the intra-host stages at once), s_x = max(1, m / C) (only the leaders
   work in the cross-host stage).
Prints the prediction, the measurement and the error, per stage and in total; a level that
misses by more than 15% is reported, not hidden. Standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

GAMMA_OVER_BETA = 0.0194 / 0.1537  # docs/scaling.md, "Parameters measured here"


def bench(mpirun, exe, np, sizes, reps, hosts, out):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_hwloc_base_binding_policy="none")
    cmd = [mpirun, "-np", str(np), exe, "--sizes-mb", sizes, "--reps", str(reps), "--warmup", "1",
           "--fake-hosts", str(hosts), "--json", out]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-2000:]}")
    with open(out) as f:
        return json.load(f)


def times(doc):
    """{(mib, algorithm): seconds}"""
    return {(row["mib"], row["algorithm"]): row["seconds"] for row in doc["rows"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--sizes-mb", default="16,64")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--json")
    a = ap.parse_args()
    g, m, cores = 2, 2, a.cores
    with tempfile.TemporaryDirectory() as d:
        two = bench(a.mpirun, a.bench, g, a.sizes_mb, a.reps, 1, os.path.join(d, "np2.json"))
        four = bench(a.mpirun, a.bench, g * m, a.sizes_mb, a.reps, m, os.path.join(d, "np4.json"))
    t2, t4 = times(two), times(four)
    cross = {c["mib"]: c["cross_host_ms"] / 1e3 for c in four.get("hier_cross_host", [])}
    s_in, s_x = max(1.0, g * m / cores), max(1.0, m / cores)
    bcast = 1.0 / (1.0 + GAMMA_OVER_BETA * (g - 1) / g)
    rows = []
    print(f"two-level model, {m} hosts x {g} processes (declared), {cores} cores: s_in = {s_in:g}, s_x = {s_x:g}, "
          f"T_bcast = {bcast:.3f} T_shm")
    print(f"{'MiB':>6} {'T_shm(2)':>9} {'T_mpi(2)':>9} | {'inner pred':>10} {'inner meas':>10} {'err':>7} | "
          f"{'cross pred':>10} {'cross meas':>10} {'err':>7} | {'total pred':>10} {'total meas':>10} {'err':>7} | "
          f"{'flat shm 4':>10} {'flat mpi 4':>10}")
    for mib in sorted({k[0] for k in t4}):
        shm2, mpi2 = t2[(mib, "strata shm")], t2[(mib, "strata mpi")]
        inner_pred = s_in * shm2 * (1 + bcast)
        cross_pred = s_x * mpi2
        total = t4[(mib, "strata hier")]
        cross_meas = cross.get(mib, float("nan"))
        inner_meas = total - cross_meas
        pred = inner_pred + cross_pred
        err = lambda p, x: (p - x) / x * 100  # noqa: E731
        print(f"{mib:6g} {shm2*1e3:9.2f} {mpi2*1e3:9.2f} | {inner_pred*1e3:10.2f} {inner_meas*1e3:10.2f} "
              f"{err(inner_pred, inner_meas):+6.1f}% | {cross_pred*1e3:10.2f} {cross_meas*1e3:10.2f} "
              f"{err(cross_pred, cross_meas):+6.1f}% | {pred*1e3:10.2f} {total*1e3:10.2f} {err(pred, total):+6.1f}% | "
              f"{t4[(mib, 'strata shm')]*1e3:10.2f} {t4[(mib, 'strata mpi')]*1e3:10.2f}")
        rows.append({"mib": mib, "shm_np2_s": shm2, "mpi_np2_s": mpi2, "inner_predicted_s": inner_pred,
                     "inner_measured_s": inner_meas, "cross_predicted_s": cross_pred, "cross_measured_s": cross_meas,
                     "predicted_s": pred, "measured_s": total, "error_percent": err(pred, total),
                     "flat_shm_np4_s": t4[(mib, "strata shm")], "flat_mpi_np4_s": t4[(mib, "strata mpi")],
                     "mpi_allreduce_np4_s": t4[(mib, "MPI_Allreduce")]})
    worst = max(abs(r["error_percent"]) for r in rows)
    print(f"largest error of the total: {worst:.1f}% ({'within' if worst <= 15 else 'NOT within'} 15%)")
    print(f"load average before/after: {two['machine'].get('load_average_before')} / {four['machine'].get('load_average_after')}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"hosts": m, "per_host": g, "cores": cores, "s_in": s_in, "s_x": s_x, "gamma_over_beta": GAMMA_OVER_BETA,
                       "rows": rows, "machine_np2": two["machine"], "machine_np4": four["machine"]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
