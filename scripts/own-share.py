#!/usr/bin/env python3
"""LuffyMQ's own share of the broker's CPU, from CPU profiles.

The in-process A/B (BenchmarkBroker in hooks/) times vanilla Mochi against
Mochi with LuffyMQ's hooks and listener wrapper, but on a busy 2-core
machine its rounds spread by +-30 %, too much to show a 5 % cost. This
script measures the share instead: it runs BenchmarkBroker's luffymq cases
under the CPU profiler and classifies every sample by the first frame,
from the leaf up, that belongs to LuffyMQ, to Mochi or to the benchmark's
clients:

- own: a LuffyMQ frame (hooks, scoring, broker/pingreq, clientsdk/report,
  ...) comes first, with no network I/O below it: the time LuffyMQ's code
  and what it calls (maps, locks, the runtime) take;
- mochi: a Mochi frame comes first, or network I/O below a LuffyMQ frame
  (the PINGREQ reader's Read passes Mochi's reads through; vanilla Mochi
  makes the same syscalls);
- clients: the benchmark's own publishers and subscribers;
- other: neither (the garbage collector's workers, the scheduler).

The broker's CPU is own + mochi; the share is own / (own + mochi). What
LuffyMQ allocates adds garbage-collector work that lands in "other"; the
allocations per message of both systems are reported beside it (the
process's, from -benchmem).

Usage: scripts/own-share.py [--messages N] [--rounds K] [--out FILE.md]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

CASES = [("shared", 0), ("shared", 1), ("fanout", 0), ("fanout", 1)]
OURS = "github.com/luffymq/luffymq/"
MOCHI = "github.com/mochi-mqtt/server/"
CLIENTS = ("github.com/luffymq/luffymq/hooks_test.", "github.com/eclipse/paho")
IO = ("net.", "internal/poll.", "syscall.", "os.(*File)")

UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(value):
    m = re.fullmatch(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", value)
    if not m:
        raise ValueError("not a duration: %r" % value)
    return float(m.group(1)) * UNITS[m.group(2)]


def classify(frames):
    """frames: leaf first. Returns own, mochi, clients or other, and for
    own the LuffyMQ function the sample is in (the first from the leaf)."""
    io_below = False
    for f in frames:
        if f.startswith(CLIENTS):
            return "clients", None
        if f.startswith(OURS) and "_test." not in f:
            return ("mochi", None) if io_below else ("own", f[len(OURS):])
        if f.startswith(MOCHI):
            return "mochi", None
        if f.startswith(IO):
            io_below = True
    return "other", None


def parse_traces(text):
    """Yields (seconds, frames leaf first) from `go tool pprof -traces`."""
    for block in text.split("-----------+-------------------------------------------------------")[1:]:
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if not lines:
            continue
        first = lines[0].split()
        if len(first) < 2:
            continue
        try:
            value = seconds(first[0])
        except ValueError:
            continue
        frames = [first[1]] + [ln.split()[0] for ln in lines[1:] if not ln.lstrip().startswith(("bytes:", "label"))]
        yield value, frames


def run_case(pattern, qos, messages, workdir):
    prof = os.path.join(workdir, "cpu-%s-%d.prof" % (pattern, qos))
    binary = os.path.join(workdir, "hooks.test")
    bench = "^BenchmarkBroker$/^%%s$/^%s$/^qos%d$" % (pattern, qos)
    counts = {}
    for system in ("vanilla", "luffymq"):
        args = [binary, "-test.run", "^$", "-test.bench", bench % system, "-test.benchtime", "%dx" % messages,
                "-test.benchmem", "-test.count", "1"]
        if system == "luffymq":
            args += ["-test.cpuprofile", prof]
        out = subprocess.run(args, cwd=os.path.join(ROOT, "hooks"), capture_output=True, text=True, check=True).stdout
        m = re.search(r"\s([0-9.]+) cpu-ns/op.*?\s([0-9]+) B/op\s+([0-9]+) allocs/op", out)
        if not m:
            sys.exit("no result in:\n" + out)
        counts[system] = {"cpu_ns": float(m.group(1)), "bytes": int(m.group(2)), "allocs": int(m.group(3))}
    traces = subprocess.run(["go", "tool", "pprof", "-traces", binary, prof], capture_output=True, text=True, check=True).stdout
    by = {"own": 0.0, "mochi": 0.0, "clients": 0.0, "other": 0.0}
    functions = {}
    for value, frames in parse_traces(traces):
        kind, function = classify(frames)
        by[kind] += value
        if function:
            functions[function] = functions.get(function, 0.0) + value
    return by, counts, functions


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=100000, help="published messages per run")
    ap.add_argument("--rounds", type=int, default=3, help="runs per case (medians are reported)")
    ap.add_argument("--out", help="markdown file to write (default: standard output)")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        subprocess.run(["go", "test", "-c", "-o", os.path.join(workdir, "hooks.test"), "./hooks/"], cwd=ROOT, check=True)
        rows = []
        for pattern, qos in CASES:
            shares, overheads, own_allocs, own_bytes, gc = [], [], [], [], []
            where, broker_total = {}, 0.0
            for _ in range(opts.rounds):
                by, counts, functions = run_case(pattern, qos, opts.messages, workdir)
                broker = by["own"] + by["mochi"]
                broker_total += broker
                for f, v in functions.items():
                    where[f] = where.get(f, 0.0) + v
                total = sum(by.values())
                shares.append(by["own"] / broker)
                overheads.append(by["own"] / by["mochi"])
                gc.append(by["other"] / total)
                own_allocs.append(counts["luffymq"]["allocs"] - counts["vanilla"]["allocs"])
                own_bytes.append(counts["luffymq"]["bytes"] - counts["vanilla"]["bytes"])
            top = sorted(where.items(), key=lambda kv: -kv[1])[:TOP]
            rows.append((pattern, qos, shares, overheads, gc, own_allocs, own_bytes, [(f, v / broker_total) for f, v in top]))
    med = statistics.median
    lines = [
        "# LuffyMQ's own share of the broker's CPU",
        "",
        "Generated %s by `scripts/own-share.py --messages %d --rounds %d`: BenchmarkBroker's luffymq cases "
        "(hooks/ab_bench_test.go: 3 subscribers in one shared group or on one topic, 100-byte messages, in "
        "process over loopback TCP) under the CPU profiler; each sample is LuffyMQ's when a LuffyMQ frame comes "
        "first from the leaf with no network I/O below it, Mochi's when a Mochi frame or I/O does. The cost over "
        "Mochi is own ÷ Mochi's part, the garbage collector aside: its share of the process is in the next "
        "column, and LuffyMQ's part of the allocations (luffymq minus vanilla, whole process, `-benchmem`) beside "
        "it. Medians of %d rounds." % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), opts.messages, opts.rounds, opts.rounds),
        "",
        "| case | own share of the broker's CPU | cost over Mochi | GC and runtime, of the process | allocations per message over vanilla | bytes per message over vanilla |",
        "|---|---|---|---|---|---|",
    ]
    for pattern, qos, shares, overheads, gc, allocs, nbytes, _ in rows:
        lines.append("| %s QoS %d | %.1f %% (%.1f–%.1f) | %.1f %% | %.1f %% | %+.0f | %+.0f |" % (
            pattern, qos, 100 * med(shares), 100 * min(shares), 100 * max(shares), 100 * med(overheads),
            100 * med(gc), med(allocs), med(nbytes)))
    lines += ["", "Where LuffyMQ's share goes: the LuffyMQ functions the samples are in (what they call "
              "included), as parts of the broker's CPU over all rounds, the %d largest per case." % TOP, ""]
    for pattern, qos, _, _, _, _, _, top in rows:
        lines.append("- %s QoS %d: %s" % (pattern, qos, "; ".join("`%s` %.1f %%" % (f, 100 * v) for f, v in top)))
    text = "\n".join(lines) + "\n"
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)


TOP = 6
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    main()
