#!/bin/bash
# The quickstart study's wall time before and after issue 51 (benchmarks/step_cost.md), one
# worker each, fresh stores, one after the other on the same machine:
#   git worktree add /tmp/before d372ec9
#   BEFORE=/tmp/before AFTER=$PWD RECORDS=/tmp/qs bash benchmarks/step_cost/quickstart_before_after.sh 1
# Both sides run with $AFTER's virtual environment; $BEFORE's code is put first on PYTHONPATH.
set -u
mkdir -p "$RECORDS"
export OMP_WAIT_POLICY=PASSIVE
for side in before after; do
  if [ $side = before ]; then dir=$BEFORE; pp=$BEFORE; else dir=$AFTER; pp=; fi
  home=$RECORDS/home-$side-$1; rm -rf $home; mkdir -p $home
  cd $dir
  echo "$side start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $RECORDS/times.txt
  s=$(date +%s.%N)
  HARNESS_HOME=$home PYTHONPATH=$pp /usr/bin/time -f "%e s wall %U user %S sys" -o $RECORDS/$side-$1.time \
     $AFTER/.venv/bin/python -m harness.cli study run studies/quickstart.yaml > $RECORDS/$side-$1.log 2>&1
  rc=$?
  e=$(date +%s.%N)
  echo "$side rc=$rc wall $(echo "$e - $s" | bc) s; $(cat $RECORDS/$side-$1.time) end load $(cut -d' ' -f1-3 /proc/loadavg)" >> $RECORDS/times.txt
done
