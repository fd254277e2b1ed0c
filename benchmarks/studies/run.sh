#!/usr/bin/env bash
# Run a shipped study's CPU profile to completion on a fresh store and record how:
#
#   benchmarks/studies/run.sh STUDY [WORKERS]     # e.g. benchmarks/studies/run.sh mixers_lm
#
# writes the report to benchmarks/studies/STUDY/ (md, json, csv and the figures) and
# benchmarks/studies/STUDY/RUN.md: machine, versions, command, wall and CPU time (of the
# command and its extra workers, from /usr/bin/time -v), the load average sampled every 30 s,
# and the worker logs. The store is a scratch HARNESS_HOME, removed afterwards.
set -euo pipefail
study=${1:?usage: run.sh STUDY [WORKERS]}
workers=${2:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
out="$root/benchmarks/studies/$study"
scratch=$(mktemp -d "/tmp/harness-study-$study-XXXX")
# KEEP_HOME=DIR: the study's store goes to DIR and is kept (to write its report again later:
# HARNESS_HOME=DIR harness report STUDY-cpu --out benchmarks/studies/STUDY ...)
export HARNESS_HOME="${KEEP_HOME:-$scratch/home}" OMP_WAIT_POLICY=PASSIVE
cmd=(harness study run "studies/$study.yaml" --profile cpu --workers "$workers" --report
     --out "$scratch/report" --format md,json,csv)
out=${RUN_OUT:-$out}  # a trial of this script: RUN_OUT=/tmp/x SETS="--set budget.steps=10" ...
# shellcheck disable=SC2206
cmd+=(${SETS:-})

cd "$root"
commit="$(git rev-parse --short HEAD)$(git diff --quiet -- harness plugins studies || echo ' (with uncommitted changes)')"
start_uptime=$(uptime); start=$(date -u +%FT%TZ); t0=$(date +%s)
( while sleep 30; do cut -d' ' -f1 /proc/loadavg; done ) > "$scratch/load" &
sampler=$!
trap 'kill $sampler 2>/dev/null || true' EXIT
/usr/bin/time -v "${cmd[@]}" > "$scratch/stdout" 2> "$scratch/time" || {
  tail -n 40 "$scratch/stdout" "$scratch/time"; exit 1; }
t1=$(date +%s); end=$(date -u +%FT%TZ); end_uptime=$(uptime)
kill $sampler 2>/dev/null || true

rm -rf "$out"; mkdir -p "$out"; cp -r "$scratch/report/." "$out/"
user=$(awk -F': ' '/User time/ {print $2}' "$scratch/time")
sys=$(awk -F': ' '/System time/ {print $2}' "$scratch/time")
loads=$(sort -n "$scratch/load" | awk '{a[NR]=$1} END {if (NR) printf "min %s, median %s, max %s (%d samples)", a[1], a[int((NR+1)/2)], a[NR], NR; else print "no sample"}')
versions=$(python - <<'EOF'
import platform, importlib.metadata as m
print(f"Python {platform.python_version()}, " + ", ".join(
    f"{p} {m.version(p)}" for p in ("torch", "lightning", "optuna", "mlflow", "scipy")))
EOF
)
cpu=$(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)
mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)
{
  echo "# How this report was produced"
  echo
  echo "- Study: \`studies/$study.yaml\`, profile \`cpu\`, $workers worker(s) from one command (\`--workers $workers\`)"
  echo "- Command: \`benchmarks/studies/run.sh $study $workers\`, i.e. \`${cmd[*]//$scratch\/report/benchmarks/studies/$study}\`"
  echo "  (with \`OMP_WAIT_POLICY=PASSIVE\`, a fresh project store in a scratch \`HARNESS_HOME\`)"
  echo "- Machine: $cpu, $(nproc --all) cores visible, $mem, no GPU; Linux $(uname -r)"
  echo "- Versions: $versions; harness at commit $commit"
  echo "- Started $start, ended $end"
  echo "- **Wall time $(awk -v s=$((t1 - t0)) 'BEGIN {printf "%.1f min", s/60}')** ($((t1 - t0)) s); CPU time of the command and its workers $(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.1f min (user %.0f s + sys %.0f s)", (u+s)/60, u, s}') (\`/usr/bin/time -v\`)"
  echo "- Load: 1-minute load average sampled every 30 s during the run: $loads on $(nproc --all) cores"
  echo "  (uptime at start: \`$start_uptime\`; at end: \`$end_uptime\`)"
  echo
  echo "Output of the command (the first worker's lines; the other worker's log follows):"
  echo
  echo '```'
  grep -v '^progress:' "$scratch/stdout" || true
  echo '```'
  for log in "$HARNESS_HOME"/logs/*-worker-*.log; do
    [ -e "$log" ] || continue
    echo
    echo "$(basename "$log"):"
    echo
    echo '```'
    grep -v '^progress:' "$log" || true
    echo '```'
  done
} > "$out/RUN.md"
rm -rf "$scratch"
echo "wrote $out (wall $((t1 - t0)) s)"
