"""The scale-out section: one hydrant process on one core against a two-process timely
cluster, one process per core, each in its own network namespace joined by a veth pair
(two "nodes" with a real network between them, on one machine).

Needs root and `ip netns` (iproute2); without them the section says so and is skipped.
"""
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import uuid

# Addresses inside the two namespaces this section makes (and removes): nothing else
# is ever sent to.
SUBNET = "10.231.7"


def available():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("taskset"):
        return False
    probe = f"hyprobe{uuid.uuid4().hex[:6]}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok and (os.cpu_count() or 1) >= 2


class Namespaces:
    """Two namespaces, a veth pair between them, loopback up in both."""

    def __init__(self):
        tag = uuid.uuid4().hex[:6]
        self.names = [f"hya{tag}", f"hyb{tag}"]
        self.addresses = [f"{SUBNET}.1", f"{SUBNET}.2"]

    def __enter__(self):
        a, b = self.names
        cmds = [["ip", "netns", "add", a], ["ip", "netns", "add", b],
                ["ip", "link", "add", f"v{a}", "type", "veth", "peer", "name", f"v{b}"],
                ["ip", "link", "set", f"v{a}", "netns", a],
                ["ip", "link", "set", f"v{b}", "netns", b]]
        for ns, addr in zip(self.names, self.addresses):
            cmds += [["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", f"v{ns}"],
                     ["ip", "-n", ns, "link", "set", f"v{ns}", "up"],
                     ["ip", "-n", ns, "link", "set", "lo", "up"]]
        for c in cmds:
            subprocess.run(c, check=True, capture_output=True)
        return self

    def __exit__(self, *exc):
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def run(hydrant, args, work, generate, measure):
    """Rows per second of one process on one core, and of two processes on a core each."""
    if not available():
        print("cluster: skipped (needs root, ip netns, taskset and 2 cores)", flush=True)
        return {"skipped": "needs root, ip netns, taskset and 2 cores"}
    rows = args.cluster_rows
    path = generate(work, rows)
    toml = str(pathlib.Path(__file__).resolve().parents[1] / "examples" / "criteo_hash.toml")
    state = work / f"state-cluster-{rows}.json"
    measure([str(hydrant), "fit", "--pipeline", toml, "--input", str(path), "--out", str(state)])
    common = ["run", "--pipeline", toml, "--input", str(path), "--state", str(state),
              "--ranks", "2", "--batch-size", "4096", "--sink", "null", "--workers", "1"]
    runs = {"1 process, 1 core": [], "2 processes, 1 core each": []}
    print(f"cluster: {rows:,} rows", flush=True)
    with Namespaces() as ns:
        hosts = work / "hosts.txt"
        hosts.write_text("".join(f"{a}:2101\n" for a in ns.addresses))
        for rep in range(args.reps):
            # Started and timed as each of the two is (`ip netns exec`, wall clock from
            # the start to the end of the process), so that both pay the same start-up.
            one = measure(["ip", "netns", "exec", ns.names[0], "taskset", "-c", "0",
                           str(hydrant), *common])
            if one["rows"] != rows:
                raise RuntimeError(f"one process delivered {one['rows']} rows of {rows}")
            runs["1 process, 1 core"].append({"rows_per_s": rows / one["wall_s"],
                                              "seconds": one["wall_s"]})
            two = two_processes(hydrant, common, ns, hosts)
            if sum(s["rows"] for s in two["summaries"]) != rows:
                raise RuntimeError(f"two processes delivered {two['summaries']} of {rows} rows")
            runs["2 processes, 1 core each"].append({"rows_per_s": rows / two["seconds"],
                                                     "seconds": two["seconds"]})
            for name, r in runs.items():
                print(f"  {rep + 1}/{args.reps} {name:26} {r[-1]['seconds']:7.3f} s  "
                      f"{r[-1]['rows_per_s'] / 1e6:6.2f} M rows/s", flush=True)
    return {"rows": rows, "runs": runs}


def two_processes(hydrant, common, ns, hosts):
    """Process 0 in the first namespace on core 0, process 1 in the second on core 1;
    timed from the start of process 1 (process 0 only waits for it to connect) to the
    end of both."""
    procs = []
    for p, name in enumerate(ns.names):
        argv = ["ip", "netns", "exec", name, "taskset", "-c", str(p), str(hydrant), *common,
                "--processes", "2", "--process", str(p), "--hostfile", str(hosts)]
        if p == 1:
            time.sleep(0.3)  # listening first spares process 1 timely's 1 s connect retry
            t0 = time.perf_counter()
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    summaries = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"cluster process failed ({proc.returncode}):\n{err[-3000:]}")
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    return {"seconds": time.perf_counter() - t0, "summaries": summaries}


def section(cluster, charts, targets, med):
    """BENCHMARKS.md lines (and bench/charts/cluster.png) for the scale-out runs."""
    if "skipped" in cluster:
        return ["## Scale-out: two processes, one core each", "",
                f"Not measured: {cluster['skipped']}.", ""]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = cluster["runs"]
    one = med(runs["1 process, 1 core"], "rows_per_s")
    two = med(runs["2 processes, 1 core each"], "rows_per_s")
    targets.append(f"| Scale-out: 2 processes (a core each, netns + veth) ≥ 1.8x one | "
                   f"{two / 1e6:.2f} vs {one / 1e6:.2f} M rows/s: {two / one:.2f}x | "
                   f"{'yes' if two >= 1.8 * one else '**no**'} |")
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar(list(runs), [one / 1e6, two / 1e6], color=["#888", "#1f77b4"])
    ax.set_ylabel("M rows/s")
    ax.set_title(f"{cluster['rows']:,} rows, criteo_hash, 2 ranks")
    fig.tight_layout()
    fig.savefig(charts / "cluster.png", dpi=110)
    plt.close(fig)
    return [
        "## Scale-out: two processes, one core each",
        "",
        f"{cluster['rows']:,} rows, `examples/criteo_hash.toml` with a fitted state, 2 ranks "
        "of 4,096, the loaders' null sink, `--workers 1`. One process pinned to one core "
        "(`taskset`) against a two-process timely cluster: each process in its own network "
        "namespace, joined by a veth pair, pinned to its own core, reading and featurizing "
        "only its own rank's share of the input and delivering that rank (only the last, "
        "short step's rows cross the veth). Rows per second of the whole job, median over "
        "runs (`bench/cluster.py`).",
        "",
        "| layout | M rows/s (median) | runs |",
        "| --- | --- | --- |",
        *(f"| {name} | {med(r, 'rows_per_s') / 1e6:.2f} | {len(r)} |" for name, r in runs.items()),
        f"| ratio | {two / one:.2f}x | |",
        "",
        "![rows per second, one process against two](bench/charts/cluster.png)",
        "",
    ]
