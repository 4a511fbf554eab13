#!/usr/bin/env python3
"""Turns the results of bench/fsbench into Markdown tables, target checks and charts.

  fsbench_report.py --results results.tsv [--meta meta.txt] [--events events.txt]
                    [--svg chart.svg]

results.tsv has one line per figure: workload, metric, file system, value.
Every ratio is a ratio of speeds (throughput, or 1/time for PostMark), so
above 1 always means plyfs was faster. Figures are printed as measured.
"""
import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

FS = ["plyfs5", "plyfs0", "plyfsu", "ext4", "fuse2fs", "passthrough_ll", "tmpfs"]
LABEL = {"plyfs5": "plyfs commit=5", "plyfs0": "plyfs commit=0", "plyfsu": "plyfs commit=5 uring",
         "ext4": "ext4 (loop)",
         "fuse2fs": "fuse2fs", "passthrough_ll": "passthrough_ll", "tmpfs": "tmpfs"}
SHORT = {"plyfs5": "plyfs c=5", "plyfs0": "plyfs c=0", "plyfsu": "plyfs uring", "ext4": "ext4",
         "fuse2fs": "fuse2fs",
         "passthrough_ll": "pt_ll", "tmpfs": "tmpfs"}

# (workload, metric, label, unit, higher is better, counts for targets)
METRICS = [
    ("files", "create", "create", "files/s", True, True),
    ("files", "delete", "delete", "files/s", True, True),
    ("postmark", "seconds", "run time", "s", False, True),
    ("postmark", "tx_per_s", "transactions/s (postmark's own, whole seconds; info)", "tx/s",
     True, False),
    ("dbench", "c1", "1 client", "MB/s", True, True),
    ("dbench", "c4", "4 clients", "MB/s", True, True),
    ("dbench", "c16", "16 clients", "MB/s", True, True),
    ("fio", "write-4k", "write, bs 4k", "MiB/s", True, True),
    ("fio", "read-4k", "read, bs 4k", "MiB/s", True, True),
    ("fio", "write-64k", "write, bs 64k", "MiB/s", True, True),
    ("fio", "read-64k", "read, bs 64k", "MiB/s", True, True),
    ("fio", "write-1m", "write, bs 1M", "MiB/s", True, True),
    ("fio", "read-1m", "read, bs 1M", "MiB/s", True, True),
]
TITLE = {
    "files": "1. Many files: empty files in directories, create then delete",
    "postmark": "2. PostMark",
    "dbench": "3. dbench",
    "fio": "4. fio, sequential, one file",
}


def load(path):
    """The median of each figure's runs (--repeat), and every run's values."""
    runs = {}
    with open(path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 4:
                continue
            wl, metric, fs, value = parts
            try:
                runs.setdefault((wl, metric, fs), []).append(float(value))
            except ValueError:
                pass
    return {k: statistics.median(v) for k, v in runs.items()}, runs


def load_meta(path):
    meta = {}
    if path and os.path.exists(path):
        for line in open(path):
            if "=" in line:
                k, v = line.rstrip("\n").split("=", 1)
                meta[k] = v
    return meta


def fmt(v):
    if v is None:
        return "FAIL"
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def speed(v, higher):
    if v is None or v <= 0:
        return None
    return v if higher else 1.0 / v


def ratio(res, wl, metric, higher, a, b):
    sa, sb = speed(res.get((wl, metric, a)), higher), speed(res.get((wl, metric, b)), higher)
    if sa is None or sb is None:
        return None
    return sa / sb


def fr(r):
    return "–" if r is None else f"{r:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--meta")
    ap.add_argument("--events")
    ap.add_argument("--svg")
    args = ap.parse_args()
    res, runs = load(args.results)
    meta = load_meta(args.meta)
    ran_fs = meta.get("filesystems", " ".join(FS)).split()
    ran_wl = meta.get("workloads", "files postmark dbench fio").split()
    fss = [f for f in FS if f in ran_fs]
    out = []
    p = out.append

    def val(wl, metric, fs):
        return res.get((wl, metric, fs))

    ratio_cols = [("plyfs5", "fuse2fs"), ("plyfs5", "passthrough_ll"), ("plyfs5", "ext4"),
                  ("plyfs5", "plyfs0"), ("plyfsu", "fuse2fs"), ("plyfsu", "passthrough_ll"),
                  ("plyfsu", "plyfs5")]
    ratio_cols = [(a, b) for a, b in ratio_cols if a in fss and b in fss]
    for wl in ran_wl:
        ms = [m for m in METRICS if m[0] == wl]
        p(f"#### {TITLE[wl]}")
        p("")
        if any(len(v) > 1 for v in runs.values()):
            p("Medians of the repeated runs; every run's figures are in results.tsv.")
            p("")
        head = ["", "unit"] + [SHORT[f] for f in fss] + \
               [f"{SHORT[a]} / {SHORT[b]}" for a, b in ratio_cols]
        p("| " + " | ".join(head) + " |")
        p("|" + "---|" * len(head))
        for (_, metric, label, unit, higher, _t) in ms:
            row = [label, unit + ("" if higher else " (lower is better)")]
            row += [fmt(val(wl, metric, f)) for f in fss]
            row += [fr(ratio(res, wl, metric, higher, a, b)) for a, b in ratio_cols]
            p("| " + " | ".join(row) + " |")
        p("")

    # 5. the cost of consistency
    cons = []
    if "plyfs5" in fss and "plyfs0" in fss:
        p("#### 5. The cost of consistency: plyfs commit=5 against commit=0")
        p("")
        p("Overhead = speed with commit=0 / speed with commit=5 − 1 (negative: commit=5 was "
          "faster in this run).")
        p("")
        p("| workload | commit=5 | commit=0 | unit | overhead |")
        p("|---|---|---|---|---|")
        for (wl, metric, label, unit, higher, t) in METRICS:
            if wl not in ("files", "postmark", "dbench") or wl not in ran_wl or not t:
                continue
            r = ratio(res, wl, metric, higher, "plyfs0", "plyfs5")
            ov = None if r is None else (r - 1) * 100
            cons.append((f"{wl} {label}", ov))
            p(f"| {wl} {label} | {fmt(val(wl, metric, 'plyfs5'))} | "
              f"{fmt(val(wl, metric, 'plyfs0'))} | {unit} | "
              f"{'–' if ov is None else f'{ov:+.1f} %'} |")
        p("")

    # targets
    checks = []
    for (wl, metric, label, unit, higher, t) in METRICS:
        if not t or wl not in ran_wl:
            continue
        name = f"{wl} {label}"
        if wl in ("files", "postmark", "dbench"):
            if "fuse2fs" in fss:
                r = ratio(res, wl, metric, higher, "plyfs5", "fuse2fs")
                checks.append(("1–3: ≥ 2× fuse2fs", name, r, None if r is None else r >= 2.0,
                               "×" if r is not None else ""))
            if "passthrough_ll" in fss:
                r = ratio(res, wl, metric, higher, "plyfs5", "passthrough_ll")
                checks.append(("1–3: within 1.5× of passthrough_ll (≥ 0.667)", name, r,
                               None if r is None else r >= 1 / 1.5, "×" if r is not None else ""))
        if wl == "fio" and metric.endswith("-1m") and "passthrough_ll" in fss:
            r = ratio(res, wl, metric, higher, "plyfs5", "passthrough_ll")
            checks.append(("4: 1 MiB ≥ 80 % of passthrough_ll", name,
                           None if r is None else r * 100, None if r is None else r >= 0.8, " %"))
    for name, ov in cons:
        checks.append(("5: commit=5 overhead ≤ 4 %", name, ov, None if ov is None else ov <= 4.0,
                       " %"))
    if checks:
        p("#### Targets (plyfs commit=5)")
        p("")
        p("| target | workload | measured | |")
        p("|---|---|---|---|")
        for tgt, name, v, ok, unit in checks:
            meas = "–" if v is None else (f"{v:.2f}{unit}" if unit == "×" else f"{v:+.1f}{unit}"
                                          if tgt.startswith("5") else f"{v:.0f}{unit}")
            verdict = "n/a (no figure)" if ok is None else ("**PASS**" if ok else "**MISS**")
            p(f"| {tgt} | {name} | {meas} | {verdict} |")
        npass = sum(1 for c in checks if c[3] is True)
        nmiss = sum(1 for c in checks if c[3] is False)
        p("")
        p(f"{npass} pass, {nmiss} miss, {len(checks) - npass - nmiss} without a figure.")
        p("")

    # ASCII chart: plyfs commit=5 and fuse2fs relative to passthrough_ll
    if "passthrough_ll" in fss and "plyfs5" in fss:
        p("#### Speed relative to passthrough_ll (| = 1.0; # plyfs commit=5, = fuse2fs)")
        p("")
        p("```")
        scale = 25
        for (wl, metric, label, unit, higher, t) in METRICS:
            if not t or wl not in ran_wl:
                continue
            for f, ch in (("plyfs5", "#"), ("fuse2fs", "=")):
                if f not in fss:
                    continue
                r = ratio(res, wl, metric, higher, f, "passthrough_ll")
                name = f"{wl} {label}"[:22] if f == "plyfs5" else ""
                if r is None:
                    bar = "(no figure)"
                else:
                    n = min(int(round(r * scale)), 2 * scale + 10)
                    bar = (ch * n).ljust(scale)
                    bar = bar[:scale] + "|" + bar[scale:]
                    if r * scale > 2 * scale + 10:
                        bar += ">"
                    bar = bar.rstrip() + f" {r:.2f}"
                p(f"{name:<22} {bar}")
        p("```")
        p("")

    loads = []
    with open(args.results) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 4 and parts[1].startswith("load"):
                try:
                    loads.append(float(parts[3]))
                except ValueError:
                    pass
    if loads:
        p(f"1-minute load average after each run: {min(loads):.2f}–{max(loads):.2f} "
          f"(median {sorted(loads)[len(loads) // 2]:.2f}) on {meta.get('nproc', '?')} CPUs.")
        p("")

    ev = ""
    if args.events and os.path.exists(args.events):
        ev = open(args.events).read().strip()
    p("#### Failures and errors")
    p("")
    if ev:
        p("```")
        p(ev)
        p("```")
    else:
        p("None: every daemon mounted, ran and exited with status 0, and `fsck.plyfs -n` "
          "was clean after every plyfs run.")
    p("")
    print("\n".join(out))

    if args.svg and shutil.which("gnuplot") and "passthrough_ll" in fss:
        rows = [(f"{wl} {label}" if wl != "postmark" else "postmark", wl, metric, higher)
                for (wl, metric, label, unit, higher, t) in METRICS if t and wl in ran_wl]
        with tempfile.TemporaryDirectory() as d:
            dat = os.path.join(d, "data")
            with open(dat, "w") as f:
                f.write("metric " + " ".join(f'"{LABEL[x]}"' for x in fss) + "\n")
                for name, wl, metric, higher in rows:
                    vals = []
                    for x in fss:
                        r = ratio(res, wl, metric, higher, x, "passthrough_ll")
                        vals.append("?" if r is None else f"{r:.4f}")
                    f.write(f'"{name}" ' + " ".join(vals) + "\n")
            gp = f"""
set terminal svg size 1100,480 font "sans,11" background rgb "white"
set output "{args.svg}"
set datafile missing "?"
set style data histogram
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set logscale y 2
set yrange [0.01:16]
set ytics ("1/64" 0.015625, "1/16" 0.0625, "1/4" 0.25, "1" 1, "4" 4, "16" 16)
set grid ytics
set ylabel "speed relative to passthrough_ll (log scale)"
set xtics rotate by -30 scale 0 font "sans,10"
set key top left horizontal
set title "plyfs fsbench: speed relative to passthrough\\_ll over tmpfs (higher is faster)"
plot for [i=2:{len(fss) + 1}] "{dat}" using i:xtic(1) title columnheader(i)
"""
            subprocess.run(["gnuplot"], input=gp, text=True, check=False)


if __name__ == "__main__":
    main()
