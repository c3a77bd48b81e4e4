#!/usr/bin/env python3
"""LuffyMQ's own share of the broker's CPU, from CPU profiles.

The in-process A/B (BenchmarkBroker in hooks/) times vanilla Mochi against
Mochi with LuffyMQ's hooks and listener wrapper, but on a busy 2-core
machine its rounds spread by +-30 %, too much to show a 5 % cost. This
script measures the share instead: it runs BenchmarkBroker's luffymq cases
(Mochi with the selection hook, and luffymq-broker: the broker itself with
every hook its default flags add) under the CPU profiler and classifies
every sample by the first frame, from the leaf up, that belongs to LuffyMQ,
to Mochi or to the benchmark's clients:

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

The share is not the cost: in a shared group LuffyMQ's OnSelectSubscribers
does the member selection and merge that vanilla Mochi does itself (its
SelectShared then finds nothing to do), and Mochi's hook dispatch, Mochi
frames, runs only because LuffyMQ's hooks are there. So vanilla Mochi is
profiled on the same messages too, and the cost over vanilla is the
difference of the two brokers' CPU (own + mochi against vanilla's mochi),
over vanilla's: what the in-process A/B measures, from the broker's
samples only (the clients' and the collector's aside), which spread less
than the A/B's timings.

The connect path is measured the same way with BenchmarkConnect
(hooks/connect_bench_test.go): devices that connect, subscribe to their own
topic and stay connected, as `luffy-bench connections` sets them up (the
devices' code, bench/connections, counts as clients).

Usage: scripts/own-share.py [--messages N] [--connects N] [--rounds K] [--cases LIST] [--out FILE.md]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

CASES = [("shared", 0), ("shared", 1), ("fanout", 0), ("fanout", 1), ("connect", None)]
SYSTEMS = ("luffymq", "luffymq-broker")
OURS = "github.com/luffymq/luffymq/"
MOCHI = "github.com/mochi-mqtt/server/"
CLIENTS = ("github.com/luffymq/luffymq/hooks_test.", "github.com/luffymq/luffymq/bench/", "github.com/eclipse/paho")
IO = ("net.", "internal/poll.", "syscall.", "os.(*File)")

BYTES = {"B": 1, "kB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds(value):
    m = re.fullmatch(r"([0-9.]+)(ns|us|µs|ms|s|m|h)", value)
    if not m:
        raise ValueError("not a duration: %r" % value)
    return float(m.group(1)) * UNITS[m.group(2)]


def quantity(value):
    """A -traces sample value: a duration in seconds, or bytes."""
    m = re.fullmatch(r"([0-9.]+)(B|kB|MB|GB|TB)", value)
    if m:
        return float(m.group(1)) * BYTES[m.group(2)]
    return seconds(value)


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
        # A heap profile's blocks start with a "bytes:" label line.
        lines = [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith(("bytes:", "label"))]
        if not lines:
            continue
        first = lines[0].split()
        if len(first) < 2:
            continue
        try:
            value = quantity(first[0])
        except ValueError:
            continue
        frames = [first[1]] + [ln.split()[0] for ln in lines[1:] if not ln.lstrip().startswith(("bytes:", "label"))]
        yield value, frames


def case_name(pattern, qos):
    """The case's name in the report: "shared QoS 0", "connect"."""
    return pattern if qos is None else "%s QoS %d" % (pattern, qos)


def profile(system, pattern, qos, n, workdir):
    """Runs one case (BenchmarkBroker's, or BenchmarkConnect's when qos is
    None) with n messages or devices under the CPU profiler. Returns its
    seconds by kind, its -benchmem counts and LuffyMQ's seconds by
    function."""
    binary = os.path.join(workdir, "hooks.test")
    prof = os.path.join(workdir, "cpu-%s-%s-%s.prof" % (system, pattern, qos))
    if qos is None:
        bench = "^BenchmarkConnect$/^%s$" % system
    else:
        bench = "^BenchmarkBroker$/^%s$/^%s$/^qos%d$" % (system, pattern, qos)
    args = [binary, "-test.run", "^$", "-test.bench", bench, "-test.benchtime", "%dx" % n,
            "-test.benchmem", "-test.count", "1", "-test.cpuprofile", prof]
    out = subprocess.run(args, cwd=os.path.join(ROOT, "hooks"), capture_output=True, text=True, check=True).stdout
    m = re.search(r"\s([0-9.]+) cpu-ns/op.*?\s([0-9]+) B/op\s+([0-9]+) allocs/op", out)
    if not m:
        sys.exit("no result in:\n" + out)
    counts = {"cpu_ns": float(m.group(1)), "bytes": int(m.group(2)), "allocs": int(m.group(3))}
    by, functions = classified(binary, prof)
    return by, counts, functions


def classified(binary, prof, *pprof_flags):
    """A profile's samples summed by kind (own, mochi, clients, other), and
    LuffyMQ's by function."""
    traces = subprocess.run(["go", "tool", "pprof", "-traces", *pprof_flags, binary, prof],
                            capture_output=True, text=True, check=True).stdout
    by = {"own": 0.0, "mochi": 0.0, "clients": 0.0, "other": 0.0}
    functions = {}
    for value, frames in parse_traces(traces):
        kind, function = classify(frames)
        by[kind] += value
        if function:
            functions[function] = functions.get(function, 0.0) + value
    return by, functions


def heap_profile(system, n, workdir):
    """Connects n devices to system with every allocation recorded, and
    returns the bytes the process holds once they are all connected, by
    kind (own, mochi, clients, other)."""
    binary = os.path.join(workdir, "hooks.test")
    prof = os.path.join(workdir, "heap-%s.prof" % system)
    args = [binary, "-test.run", "^$", "-test.bench", "^BenchmarkConnect$/^%s$" % system, "-test.benchtime", "%dx" % n,
            "-test.count", "1", "-test.memprofilerate", "1", "-connect-heap-profile", prof]
    subprocess.run(args, cwd=os.path.join(ROOT, "hooks"), capture_output=True, text=True, check=True)
    return classified(binary, prof, "-sample_index=inuse_space")[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=100000, help="published messages per run")
    ap.add_argument("--connects", type=int, default=5000,
                    help="devices per connect run (both ends of each are in the process: at most half the open-file limit)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per case (medians are reported)")
    ap.add_argument("--cases", default="all",
                    help="comma-separated cases: shared0, shared1, fanout0, fanout1, connect, or all")
    ap.add_argument("--out", help="markdown file to write (default: standard output)")
    opts = ap.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        subprocess.run(["go", "test", "-c", "-o", os.path.join(workdir, "hooks.test"), "./hooks/"], cwd=ROOT, check=True)
        rows = []
        heaps = None
        wanted = None if opts.cases == "all" else set(opts.cases.split(","))
        cases = [(p, q) for p, q in CASES if wanted is None or p + ("" if q is None else str(q)) in wanted]
        if not cases:
            sys.exit("no case matches --cases %s" % opts.cases)
        for pattern, qos in cases:
            n = opts.connects if qos is None else opts.messages
            acc = {system: {"shares": [], "overheads": [], "costs": [], "gc": [], "allocs": [], "bytes": [],
                            "where": {}, "broker": 0.0} for system in SYSTEMS}
            for _ in range(opts.rounds):
                # A round runs vanilla Mochi, then each LuffyMQ system, so
                # that each is compared with the vanilla run nearest it in
                # time.
                vanilla, vanilla_counts, _ = profile("vanilla", pattern, qos, n, workdir)
                vanilla_broker = vanilla["own"] + vanilla["mochi"]
                for system in SYSTEMS:
                    by, counts, functions = profile(system, pattern, qos, n, workdir)
                    a = acc[system]
                    broker = by["own"] + by["mochi"]
                    a["broker"] += broker
                    for f, v in functions.items():
                        a["where"][f] = a["where"].get(f, 0.0) + v
                    a["shares"].append(by["own"] / broker)
                    a["overheads"].append(by["own"] / by["mochi"])
                    a["costs"].append(broker / vanilla_broker - 1)
                    a["gc"].append(by["other"] / sum(by.values()))
                    a["allocs"].append(counts["allocs"] - vanilla_counts["allocs"])
                    a["bytes"].append(counts["bytes"] - vanilla_counts["bytes"])
            for system in SYSTEMS:
                a = acc[system]
                top = sorted(a["where"].items(), key=lambda kv: -kv[1])[:TOP]
                rows.append((system, pattern, qos, a, [(f, v / a["broker"]) for f, v in top]))
            if qos is None:
                heaps = {system: heap_profile(system, n, workdir) for system in ("vanilla",) + SYSTEMS}
    med = statistics.median
    command = "scripts/own-share.py"
    if any(q is not None for _, q in cases):
        command += " --messages %d" % opts.messages
    if any(q is None for _, q in cases):
        command += " --connects %d" % opts.connects
    command += " --rounds %d" % opts.rounds
    if opts.cases != "all":
        command += " --cases %s" % opts.cases
    benches = []
    if any(q is not None for _, q in cases):
        benches.append("BenchmarkBroker's cases (hooks/ab_bench_test.go: 3 subscribers in one shared group or on "
                       "one topic, 100-byte messages, in process over loopback TCP)")
    if any(q is None for _, q in cases):
        benches.append("BenchmarkConnect's (hooks/connect_bench_test.go: devices connecting 32 at a time over "
                       "loopback TCP, each subscribing at QoS 1 to its own topic and staying connected; figures "
                       "per device)")
    lines = [
        "# LuffyMQ's own share of the broker's CPU",
        "",
        "Generated %s by `%s`: %s "
        "under the CPU profiler, for two LuffyMQ systems: *luffymq* (Mochi with "
        "LuffyMQ's selection and publisher-pacing hooks and its PINGREQ-reading listener) and *luffymq-broker* "
        "(the broker itself, `broker.New` with the binary's default flags: every hook it adds). Each sample is "
        "LuffyMQ's when a LuffyMQ frame comes first from the leaf with no network I/O below it, Mochi's when a "
        "Mochi frame or I/O does; *own ÷ Mochi's part* divides the two. That share is not the whole cost: in a "
        "shared group LuffyMQ's hook does the member selection vanilla Mochi does itself, and Mochi's hook "
        "dispatch (Mochi frames) runs for LuffyMQ's hooks. So vanilla Mochi is profiled on the same messages "
        "in each round, and *broker CPU over vanilla* is the system's broker samples (own + Mochi's) over "
        "vanilla's, less 1, the clients' and the garbage collector's samples aside. The collector's share of "
        "the process is in the next column, and the allocations over vanilla's (whole process, `-benchmem`) "
        "beside it. Medians of %d rounds, with the range." % (
            time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), command, " and ".join(benches), opts.rounds),
        "",
        "| system | case | own share of the broker's CPU | own ÷ Mochi's part | broker CPU over vanilla | GC and runtime, of the process | allocations per message (device) over vanilla | bytes per message (device) over vanilla |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system, pattern, qos, a, _ in rows:
        lines.append("| %s | %s | %.1f %% (%.1f–%.1f) | %.1f %% | %+.1f %% (%+.1f–%+.1f) | %.1f %% | %+.0f | %+.0f |" % (
            system, case_name(pattern, qos), 100 * med(a["shares"]), 100 * min(a["shares"]), 100 * max(a["shares"]),
            100 * med(a["overheads"]), 100 * med(a["costs"]), 100 * min(a["costs"]), 100 * max(a["costs"]),
            100 * med(a["gc"]), med(a["allocs"]), med(a["bytes"])))
    lines += ["", "Where LuffyMQ's share goes: the LuffyMQ functions the samples are in (what they call "
              "included), as parts of the broker's CPU over all rounds, the %d largest per case." % TOP, ""]
    for system, pattern, qos, _, top in rows:
        lines.append("- %s, %s: %s" % (system, case_name(pattern, qos), "; ".join("`%s` %.1f %%" % (f, 100 * v) for f, v in top)))
    if heaps:
        kib = lambda v: v / opts.connects / 1024
        vanilla_broker = heaps["vanilla"]["own"] + heaps["vanilla"]["mochi"]
        lines += ["", "Heap in use per connected device: one more run of the connect case per system with every "
                  "allocation recorded (`-test.memprofilerate 1`), the heap profile written once all %d devices are "
                  "connected and subscribed, after a garbage collection, its bytes classified as the CPU samples are "
                  "(the devices' own code, bench/connections, and paho count as the clients'). Goroutine stacks are "
                  "not heap: `luffy-bench connections` reports them (Mochi's reader and write loop per client)." % opts.connects, "",
                  "| system | LuffyMQ's | Mochi's | the broker's | over vanilla | the devices' | other (runtime) |",
                  "|---|---|---|---|---|---|---|"]
        for system in ("vanilla",) + SYSTEMS:
            h = heaps[system]
            broker = h["own"] + h["mochi"]
            lines.append("| %s | %.2f KiB | %.2f KiB | %.2f KiB | %s | %.2f KiB | %.2f KiB |" % (
                system, kib(h["own"]), kib(h["mochi"]), kib(broker),
                "—" if system == "vanilla" else "%+.2f KiB" % kib(broker - vanilla_broker), kib(h["clients"]), kib(h["other"])))
    text = "\n".join(lines) + "\n"
    if opts.out:
        with open(opts.out, "w") as f:
            f.write(text)
    sys.stdout.write(text)


TOP = 6
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    main()
