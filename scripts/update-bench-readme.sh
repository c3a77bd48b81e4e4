#!/usr/bin/env bash
# Writes the benchmark summary (bench/results/summary.md, from make bench)
# into the documentation, between markers; nothing outside them changes:
#   - docs/benchmarks.md, between <!-- BENCHMARKS:START --> and
#     <!-- BENCHMARKS:END -->: the whole report, image and file links made
#     relative to docs/;
#   - README.md, between <!-- BENCHMARKS:HEADLINE:START --> and
#     <!-- BENCHMARKS:HEADLINE:END -->: the summary's goal line comparing
#     adaptive with Mosquitto on thesis-2 with SDK subscribers, as written.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
readme="${README:-$root/README.md}"
report="${BENCH_DOC:-$root/docs/benchmarks.md}"
summary="${1:-$root/bench/results/summary.md}"
prefix="${LINK_PREFIX:-../bench/results/}"

[ -f "$summary" ] || { echo "update-bench-readme: $summary not found; run make bench first" >&2; exit 1; }

python3 - "$readme" "$report" "$summary" "$prefix" <<'PY'
import re, sys
readme_path, report_path, summary_path, prefix = sys.argv[1:5]
summary = open(summary_path, encoding="utf-8").read()

def replace_between(path, start, end, text):
    doc = open(path, encoding="utf-8").read()
    if start not in doc or end not in doc:
        sys.exit(f"update-bench-readme: markers {start} {end} missing in {path}")
    i, j = doc.index(start) + len(start), doc.index(end)
    if j < i:
        sys.exit(f"update-bench-readme: {end} before {start} in {path}")
    open(path, "w", encoding="utf-8").write(doc[:i] + "\n" + text.strip() + "\n" + doc[j:])

# The headline: one goal line of the summary, quoted as it is.
headline = [l for l in summary.splitlines()
            if l.startswith("- thesis-2 (sdk subscribers): adaptive mean ≥ 100× lower than Mosquitto:")]
if len(headline) != 1:
    sys.exit(f"update-bench-readme: {summary_path} has {len(headline)} lines for thesis-2 (sdk subscribers) against Mosquitto, want 1")

# The report: drop the summary's own title (the guide has its heading),
# demote headings to nest under the guide's "## " section, and make links
# relative to the guide.
report = re.sub(r"\A# [^\n]*\n+", "", summary)
report = re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", report, flags=re.M)
report = re.sub(r"\]\(([^)/:]+\.(?:png|json|md))\)", lambda m: "](" + prefix + m.group(1) + ")", report)
report = report.replace("`results.json`", "`bench/results/results.json`").replace("`throughput.json`", "`bench/results/throughput.json`")

replace_between(report_path, "<!-- BENCHMARKS:START -->", "<!-- BENCHMARKS:END -->", report)
replace_between(readme_path, "<!-- BENCHMARKS:HEADLINE:START -->", "<!-- BENCHMARKS:HEADLINE:END -->", headline[0])
PY
echo "update-bench-readme: docs/benchmarks.md and the README's headline refreshed from $summary"
