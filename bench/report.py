"""Turns the harness's measurements into BENCHMARKS.md and its charts."""
import datetime
import importlib.metadata
import os
import pathlib
import platform
import statistics
import subprocess

import cluster
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADLINE = "hydrant hash"
PEERS = ("polars", "ray", "spark native", "spark pandas_udf", "spark udf")
KERNELS = [  # (criterion id, NumPy id, label, target values/s or None)
    ("fill_null_log1p_standardize_clip/nulls/0.1", "chain/0.1",
     "fill_null→log1p→standardize→clip→f32, 10% nulls", 400e6),
    ("fill_null_log1p_standardize_clip/nulls/0", "chain/0.0", "the same, no nulls", 400e6),
    ("standardize_clip/nulls/0.1", "standardize_clip/0.1", "standardize→clip→f32, 10% nulls", 1e9),
    ("standardize_clip/nulls/0", "standardize_clip/0.0", "the same, no nulls", 1e9),
    ("strings/vocab_dict/0.1", "vocab_dict/0.1", "vocab, dictionary column, 10% nulls", 200e6),
    ("strings/vocab_dict/0", "vocab_dict/0.0", "vocab, no nulls", 200e6),
    ("strings/hash_dict/0.1", "hash_dict/0.1", "hash_bucket, dictionary column, 10% nulls", None),
    ("assembly/dense_13", "assembly/dense_13", "13 columns → [rows, 13] f32 (the chain)", None),
]
SIZES = (1, 10, 100, 1_000, 10_000, 100_000)


def med(runs, key):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def fmt_s(x):
    return "–" if x is None else (f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s")


def ratio(peer, ours):
    return "–" if not peer or not ours else f"{peer / ours:.1f}x"


def commit():
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip()


def installed(package):
    """`package`'s version, or that it is not installed (a run of some sections only)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def cpu_name():
    return next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                 if line.startswith("model name")), platform.processor())


def measured_where():
    """The commit, processor and day a section's figures come from: sections are run
    apart, sometimes on other machines, and their figures compare only within a section."""
    return f"{commit()} ({cpu_name()}, {datetime.date.today()})"


def machine():
    cpu = cpu_name()
    mem = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True).stdout.strip()
    at = commit()
    versions = ", ".join(f"{p} {installed(p)}"
                         for p in ("polars", "ray", "pyspark", "pyarrow", "numpy"))
    return (f"{os.cpu_count()} cores ({cpu}), {mem / 2**20:.0f} GiB memory, {platform.system()} "
            f"{platform.release()}; {rustc}; Python {platform.python_version()}, {versions}; "
            f"hydrant at {at}; {datetime.date.today()}")


def write(results, args, out):
    charts = out / "bench" / "charts"
    charts.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Benchmarks",
        "",
        "Written by `bench/run` (this whole file, charts included): hydrant and its peers on the "
        "same data, run alternately, medians of the repetitions, ratios from the same run. "
        "Regenerate with `bench/run` (about half an hour here); `bench/run --smoke` is the quick "
        "check CI runs.",
        "",
        f"**Machine of the last run:** {results.get('machine') or machine()}.",
        "",
        f"**Last run:** {results['args']}, {results['seconds']} s in all. Sections measured at: "
        + ", ".join(f"{s} {c}" for s, c in results.get("measured_at", {}).items()) + ".",
        "",
    ]
    targets = []
    if "e2e" in results:
        lines += e2e_section(results["e2e"], args, charts, targets)
    if "flight" in results:
        lines += flight_section(results["flight"], targets)
    if "kernels" in results:
        lines += kernel_section(results["kernels"], charts, targets)
    if "cluster" in results:
        lines += cluster.section(results["cluster"], charts, targets, med)
    lines[8:8] = ["## Targets", "", "| target | measured | met |", "| --- | --- | --- |",
                  *targets, ""]
    analysis = ROOT / "bench" / "analysis.md"
    if analysis.exists():
        lines += [analysis.read_text()]
    (out / "BENCHMARKS.md").write_text("\n".join(lines) + "\n")


def e2e_section(e2e, args, charts, targets):
    systems = list(dict.fromkeys(k.split("|")[0] for k in e2e))
    sizes = sorted({int(k.split("|")[1]) for k in e2e})
    headline = sizes[len(sizes) // 2] if len(sizes) > 2 else sizes[-1]
    cell = lambda name, rows, key: med(e2e.get(f"{name}|{rows}", []), key)  # noqa: E731
    # As the section's own runs say: a later run of other sections may have had other --reps.
    reps = max(len(runs) for runs in e2e.values())
    lines = [
        "## End to end: the Criteo job to training batches for 2 ranks",
        "",
        "Fit (mean and std of log1p of 13 numeric columns; for `vocab`, also 26 vocabularies), "
        "transform, and deliver 4096-row batches of dense `[B, 13]` float32 and ids `[B, 26]` "
        "int64. hydrant: `hydrant run --pipeline examples/criteo_hash.toml` (hashed ids, the "
        "job every peer runs) or `examples/criteo.toml` (vocabularies) `--input FILE --ranks 2 "
        "--batch-size 4096 --sink null` (the null sink takes each rank's batches from its "
        "loader); `fitted state` adds `--state` from an earlier `hydrant fit`. Peers: "
        "`bench/peers/polars_criteo.py` (Polars, 4096-row NumPy batches), "
        "`bench/peers/ray_criteo.py` (Ray Data: read_parquet, a pass of partial moments, "
        "map_batches featurize, streaming_split(2, equal=True), each rank's "
        "iter_batches(4096) in its own thread, as Ray Train feeds ranks), "
        "`bench/peers/spark_criteo.py MODE` (Spark local[2] writes 4 Parquet shards, which are "
        "read back as batches). Input: `bench/peers/gen_criteo.py ROWS`.",
        "",
        "*total* and *first batch* are each system's own clock from its start of work (for "
        "Spark, after the session is up; for hydrant, process start); *wall* is the whole "
        "process as the harness saw it (interpreter and JVM start included); *peak* is the "
        "largest RSS of the process tree (sampled every 5 ms; for hydrant, at least its own "
        "VmHWM); *settled* is the median of the tree's RSS over the second half of the run (where a long run's memory sits; a peak is the largest of many samples of a fluctuating figure, so it creeps up with a run's length). *×* is the peer's median over hydrant hash's (higher: hydrant is faster or "
        f"smaller). Repetitions: {reps} (a system whose run took over a minute at a size "
        f"ran once there; Spark pandas_udf and udf ran up to {args.spark_udf_max_rows:,} rows).",
        "",
    ]
    for rows in sizes:
        ours = {k: cell(HEADLINE, rows, k) for k in ("total_s", "first_batch_s", "peak_mb")}
        lines += [f"### {rows:,} rows", "",
                  "| system | total | × | first batch | × | wall | peak MB | × | settled MB | runs |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name in systems:
            runs = e2e.get(f"{name}|{rows}")
            if not runs:
                continue
            t, f, w, p, m = (med(runs, k) for k in ("total_s", "first_batch_s", "wall_s", "peak_mb",
                                                      "late_median_mb"))
            lines.append(f"| {name} | {fmt_s(t)} | {ratio(t, ours['total_s'])} | {fmt_s(f)} | "
                         f"{ratio(f, ours['first_batch_s'])} | {fmt_s(w)} | {p:.0f} | "
                         f"{ratio(p, ours['peak_mb'])} | {'–' if m is None else f'{m:.0f}'} | "
                         f"{len(runs)} |")
        lines.append("")
    lines += delivered_table(e2e, systems, sizes)
    lines += ["![total time and time to the first batch per system](bench/charts/e2e.png)", "",
              "![time and peak memory against input rows](bench/charts/scaling.png)", ""]
    e2e_charts(cell, systems, sizes, headline, charts)

    def target(text, measured, ok):
        targets.append(f"| {text} | {measured} | {'yes' if ok else '**no**'} |")

    for name in (HEADLINE, "hydrant vocab"):
        t = cell(name, headline, "total_s")
        for peer, want in (("polars", 2), ("spark native", 30)):
            p = cell(peer, headline, "total_s")
            if t and p:
                target(f"{headline:,} rows, fit included: {name} ≥ {want}x faster than {peer}",
                       f"{fmt_s(t)} vs {fmt_s(p)}: {p / t:.2f}x", p / t >= want)
    for name in ("hydrant hash, fitted state", "hydrant vocab, fitted state"):
        f = cell(name, headline, "first_batch_s")
        if f is not None:
            target(f"first batch with a fitted state ({name.split(',')[0]}) < 50 ms", fmt_s(f), f < 0.05)
    big, polars = sizes[-1], cell("polars", headline, "peak_mb")
    for name in (HEADLINE, "hydrant vocab"):
        at_big, at_head = cell(name, big, "peak_mb"), cell(name, headline, "peak_mb")
        if big != headline and at_big and at_head:
            s_big, s_head = cell(name, big, "late_median_mb"), cell(name, headline, "late_median_mb")
            settled = (f"; settled {s_big:.0f} vs {s_head:.0f} MB ({s_big / s_head - 1:+.0%})"
                       if s_big and s_head else "")
            target(f"{name}: peak at {big:,} rows ≤ peak at {headline:,} + 10%",
                   f"{at_big:.0f} MB vs {at_head:.0f} MB ({at_big / at_head - 1:+.0%}){settled}",
                   at_big <= at_head * 1.1)
        if polars and at_head:
            target(f"{name}: peak at {headline:,} rows < half of Polars'",
                   f"{at_head:.0f} MB vs {polars:.0f} MB ({at_head / polars:.0%})", at_head < polars / 2)
    return lines


def delivered_table(e2e, systems, sizes):
    """What each system that feeds ranks gave them: steps per rank and rows delivered (the
    epoch guarantee is equal steps and every input row once)."""
    lines = ["### What the ranks got", "",
             "Steps per rank and real rows delivered, from the last run of each system that "
             "feeds 2 ranks (hydrant's summary; Ray's per-rank counts).", "",
             "| system | input rows | steps per rank | rows delivered | equal steps | every row |",
             "| --- | --- | --- | --- | --- | --- |"]
    for rows in sizes:
        for name in systems:
            runs = e2e.get(f"{name}|{rows}") or []
            last = runs[-1] if runs else {}
            steps = last.get("steps_per_rank")
            if not steps:
                continue
            lines.append(f"| {name} | {rows:,} | {', '.join(map(str, steps))} | "
                         f"{last['rows']:,} | {'yes' if len(set(steps)) == 1 else '**no**'} | "
                         f"{'yes' if last['rows'] == rows else '**no**'} |")
    return lines + [""]


def e2e_charts(cell, systems, sizes, headline, charts):
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(systems) + 1.5))
    ys = range(len(systems))
    ax.barh([y + 0.2 for y in ys], [cell(s, headline, "total_s") or 0 for s in systems], 0.4,
            label="total")
    ax.barh([y - 0.2 for y in ys], [cell(s, headline, "first_batch_s") or 0 for s in systems], 0.4,
            label="first batch")
    ax.set_yticks(list(ys), systems)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log scale)")
    ax.set_title(f"Criteo job to 2 ranks' training batches, {headline:,} rows")
    ax.legend()
    fig.tight_layout()
    fig.savefig(charts / "e2e.png", dpi=110)
    plt.close(fig)

    fig, (t_ax, m_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    for s in systems:
        xs = [r for r in sizes if cell(s, r, "total_s") is not None]
        t_ax.plot(xs, [cell(s, r, "total_s") for r in xs], marker="o", label=s)
        line, = m_ax.plot(xs, [cell(s, r, "peak_mb") for r in xs], marker="o", label=s)
        if s.startswith("hydrant"):
            m_ax.plot(xs, [cell(s, r, "late_median_mb") for r in xs], linestyle=":",
                      color=line.get_color())
    for ax, title in ((t_ax, "total seconds"), (m_ax, "peak RSS, MB (dotted: settled)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("input rows")
        ax.set_title(title)
    m_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(charts / "scaling.png", dpi=110)
    plt.close(fig)


def server_cpu(runs):
    """The server's CPU seconds per pull (median over runs), where its process was apart."""
    cpu = [r["server_cpu_s_per_pull"] for r in runs if "server_cpu_s_per_pull" in r]
    return f"{statistics.median(cpu):.3f}" if cpu else "–"


def first_pull(runs):
    """The warm-up pull's GB/s (median over runs), where the runs say it."""
    first = [r["first_pull_gb_per_s"] for r in runs if "first_pull_gb_per_s" in r]
    return f"{statistics.median(first):.2f}" if first else "–"


def flight_section(flight, targets):
    rows = flight["hydrant serve"][0]["rows"]
    ratios = []
    for x in ("", " x4"):
        if f"hydrant serve{x}" not in flight:
            continue  # results from before the four-stream case
        ours = med(flight[f"hydrant serve{x}"], "median_gb_per_s")
        peer = med(flight[f"pyarrow C++ server{x}"], "median_gb_per_s")
        streams = "one stream" if not x else "four concurrent streams"
        ratios.append(f"| ratio, {streams} | {ours / peer:.2f}x | | | | |")
        own = flight.get(f"pyarrow C++ server, own process{x}")
        if own:  # results from before the own-process run have none
            own = med(own, "median_gb_per_s")
            ratios.append(f"| ratio, {streams}, against the server in its own process | "
                          f"{ours / own:.2f}x | | | | |")
        same = flight.get(f"pyarrow C++ server, same columns{x}")
        if same:  # results from before the same-columns run have none
            same = med(same, "median_gb_per_s")
            ratios.append(f"| ratio, {streams}, against the server sending the same columns | "
                          f"{ours / same:.2f}x | | | | |")
        targets.append(f"| Flight, {streams}: hydrant serve ≥ 1.0x pyarrow's C++ server | "
                       f"{ours:.2f} vs {peer:.2f} GB/s: {ours / peer:.2f}x | "
                       f"{'yes' if ours >= peer else '**no**'} |")
    return [
        "## Flight: pyarrow clients pulling featurized batches over loopback",
        "",
        f"{rows:,} rows of label float32, dense [13] float32, ids [26] int64 in 65,536-row "
        "batches; bytes of those columns per second of DoGet, median of 5 pulls per run "
        "after one that warms up, median over runs. hydrant: `bench/peers/hydrant_flight.py` "
        "(`hydrant serve` with a pass-through pipeline over an Arrow IPC file of the batches, "
        "kept in memory after the warm-up pull with `--cache-mib` as pyarrow holds its table; "
        "that pull reads the file, and its rate is the \"first pull\" column; each pull is "
        "the next epoch); peer: `bench/peers/flight_pyarrow.py` (pyarrow's "
        "C++ Flight server serving them from memory). x4: four clients at once, each pulling "
        "a quarter of every batch (hydrant: one rank of four, 16,384-row batches). The peer "
        "as given runs its server in the clients' process (one gRPC runtime for both); "
        "\"own process\" runs it in a process of its own, as `hydrant serve` runs. "
        "\"same columns\" is the peer as given with the two columns every hydrant batch "
        "carries added to its batches, `row_id` uint64 and `is_padding` bool (3% more "
        "bytes, counted by neither side): the same messages on both sides. The "
        "targets compare against the peer as given.",
        "",
        "| server | GB/s (median) | best pull | first pull | server CPU s per pull | runs |",
        "| --- | --- | --- | --- | --- | --- |",
        *(f"| {name} | {med(runs, 'median_gb_per_s'):.2f} | {max(r['best_gb_per_s'] for r in runs):.2f} "
          f"| {first_pull(runs)} | {server_cpu(runs)} | {len(runs)} |"
          for name, runs in flight.items()),
        *ratios,
        "",
    ]


def kernel_section(kernels, charts, targets):
    ours, numpy = kernels["hydrant"], kernels["numpy"]
    lines = [
        "## Kernels: hydrant against NumPy in place",
        "",
        "One core, 65,536-row columns. hydrant: `cargo bench -p hydrant-operators --bench "
        "kernels` (criterion, median); NumPy: `bench/peers/numpy_kernels.py` (the same math on "
        "preallocated arrays with `out=`; for strings, the batch's dictionary mapped once by a "
        "Python dict or `xxhash`, then `np.take`), the better of a run before and after.",
        "",
        "| kernel | hydrant values/s | NumPy values/s | × NumPy |",
        "| --- | --- | --- | --- |",
    ]
    for cid, nid, label, floor in KERNELS:
        h, n = ours.get(cid), numpy.get(nid)
        if h is None or n is None:
            continue
        lines.append(f"| {label} | {h / 1e6:,.0f} M | {n / 1e6:,.0f} M | {h / n:.1f}x |")
        if floor:
            targets.append(f"| kernel {label}: ≥ {floor / 1e6:,.0f} M/s and ≥ 3x NumPy | "
                           f"{h / 1e6:,.0f} M/s, {h / n:.1f}x NumPy | "
                           f"{'yes' if h >= floor and h >= 3 * n else '**no**'} |")
    lines += [
        "",
        "### Batch size",
        "",
        "`cargo bench -p hydrant-operators --bench batch_size`: rows/s of the whole transform "
        "of a Criteo-like batch (13 numeric columns → `[B, 13]`, 26 dictionary string columns "
        "hashed → `[B, 26]`, the label), and values/s of the fused chain on one column, a fresh "
        "output per batch; NumPy the same chain.",
        "",
        "| rows per batch | hydrant transform rows/s | hydrant chain values/s | NumPy chain values/s |",
        "| --- | --- | --- | --- |",
    ]
    curve = {name: [src.get(f"{key}/{n}") for n in SIZES] for name, src, key in (
        ("hydrant transform (rows/s)", ours, "batch_transform/rows"),
        ("hydrant chain (values/s)", ours, "batch_chain/rows"),
        ("NumPy chain (values/s)", numpy, "batch_chain"))}
    for i, n in enumerate(SIZES):
        cells = " | ".join("–" if v[i] is None else f"{v[i] / 1e6:,.2f} M" for v in curve.values())
        lines.append(f"| {n:,} | {cells} |")
    lines += ["", "![kernels against NumPy](bench/charts/kernels.png)", "",
              "![throughput against rows per batch](bench/charts/batch_size.png)", ""]

    fig, ax = plt.subplots(figsize=(9, 4.5))
    shown = [(label, ours[c], numpy[n]) for c, n, label, _ in KERNELS if c in ours and n in numpy]
    ys = range(len(shown))
    ax.barh([y - 0.2 for y in ys], [h / 1e6 for _, h, _ in shown], 0.4, label="hydrant")
    ax.barh([y + 0.2 for y in ys], [n / 1e6 for _, _, n in shown], 0.4, label="NumPy in place")
    ax.set_yticks(list(ys), [label for label, _, _ in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("M values/s, one core")
    ax.legend()
    fig.tight_layout()
    fig.savefig(charts / "kernels.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, values in curve.items():
        pts = [(n, v) for n, v in zip(SIZES, values) if v]
        ax.plot([n for n, _ in pts], [v for _, v in pts], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows per batch")
    ax.set_ylabel("per second")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(charts / "batch_size.png", dpi=110)
    plt.close(fig)
    return lines
