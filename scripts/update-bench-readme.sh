#!/usr/bin/env bash
# Replaces what is between <!-- BENCHMARKS:START --> and <!-- BENCHMARKS:END -->
# in README.md with bench/results/summary.md (image links made relative to
# the repository root). Nothing outside the markers changes.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
readme="${README:-$root/README.md}"
summary="${1:-$root/bench/results/summary.md}"
prefix="${LINK_PREFIX:-bench/results/}"

[ -f "$summary" ] || { echo "update-bench-readme: $summary not found; run make bench first" >&2; exit 1; }
grep -q '<!-- BENCHMARKS:START -->' "$readme" && grep -q '<!-- BENCHMARKS:END -->' "$readme" ||
  { echo "update-bench-readme: markers missing in $readme" >&2; exit 1; }

python3 - "$readme" "$summary" "$prefix" <<'PY'
import re, sys
readme_path, summary_path, prefix = sys.argv[1:4]
readme = open(readme_path, encoding="utf-8").read()
summary = open(summary_path, encoding="utf-8").read()
# Drop the summary's own title; the README section has its heading already.
summary = re.sub(r"\A# [^\n]*\n+", "", summary)
# Demote headings so they nest under the README's "## Benchmarks".
summary = re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", summary, flags=re.M)
summary = re.sub(r"\]\(([^)/:]+\.(?:png|json|md))\)", lambda m: "](" + prefix + m.group(1) + ")", summary)
summary = summary.replace("`results.json`", "`" + prefix + "results.json`").replace("`throughput.json`", "`" + prefix + "throughput.json`")
start, end = "<!-- BENCHMARKS:START -->", "<!-- BENCHMARKS:END -->"
i, j = readme.index(start) + len(start), readme.index(end)
if j < i:
    sys.exit("update-bench-readme: END marker before START marker")
new = readme[:i] + "\n" + summary.strip() + "\n" + readme[j:]
open(readme_path, "w", encoding="utf-8").write(new)
PY
echo "update-bench-readme: README benchmark section refreshed from $summary"
