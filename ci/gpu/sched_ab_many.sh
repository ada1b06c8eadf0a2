#!/usr/bin/env bash
# Several sm90 schedule A/Bs (ci/gpu/sched_ab.sh) of one bundle in one device call, one after another, each into its own
# folder $OUT/<probe>/ (its JSON and logs.tgz): one machine start for all, and the build of the bundle's commit done
# once (the later runs find it in the cache). The bundle's commit brings every probe schedule and its FLAG.
#   here:   mkdir -p out/ab && git bundle create out/ab/kd.bundle HEAD
#   device: PROBES="seesaw2_p2:SM90_P2 seesaw2_p2d:SM90_P2D" EACH=270 TIMELINE=1 NCU_ROOM=40 bash ci/gpu/sched_ab_many.sh
#           (carry out/ab; EACH: each run's DEADLINE in seconds; keep their sum under the call's limit)
set -o pipefail
ALL_OUT=${OUT:-/tmp/kdengine-out}; t0=$(date +%s)
for pair in ${PROBES:?name the probes as PROBE:FLAG pairs}; do
  probe=${pair%%:*}; flag=${pair#*:}
  [[ -n $probe && -n $flag && $probe != "$flag" ]] || { echo "PROBES: '$pair' is not PROBE:FLAG"; exit 2; }
  echo "##### $probe (KDENGINE_$flag) at $(( $(date +%s) - t0 )) s"
  OUT="$ALL_OUT/$probe" PROBE=$probe FLAG=$flag DEADLINE=${EACH:-270} bash ci/gpu/sched_ab.sh || echo "##### $probe: exit $?"
done
echo "##### done in $(( $(date +%s) - t0 )) s"
