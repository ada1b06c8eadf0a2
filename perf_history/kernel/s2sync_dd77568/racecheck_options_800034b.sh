set -o pipefail
R=$PWD
compute-sanitizer --version | tail -2
compute-sanitizer --help > $OUT/help.txt 2>&1
grep -o -- '--racecheck-[a-z-]*' $OUT/help.txt | sort -u
rm -rf /tmp/kd && git clone -q $R/out/final/kd.bundle /tmp/kd && cd /tmp/kd && export PYTHONPATH=/tmp/kd PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdc
timeout 120 python3 -m kdengine.ops.build --arch native > /tmp/build.log 2>&1 || { tail -5 /tmp/build.log; exit 1; }
echo built
for o in $(grep -o -- '--racecheck-[a-z-]*' $OUT/help.txt | sort -u | grep -v "racecheck-report\|num-hazards\|num-workers"); do
  for shape in "--T 3 --H 2 --prefix 140" "--T 64 --prefix 700 --nsplit 2"; do
    timeout 40 compute-sanitizer --tool racecheck $o yes --print-limit 2 --show-backtrace no --error-exitcode 9 \
      python3 -m kdengine.bench.kernel once --path sm90_seesaw2 $shape > /tmp/rc.txt 2>&1
    echo "$o yes | $shape | rc=$? | $(grep -E 'RACECHECK SUMMARY|rror' /tmp/rc.txt | head -2 | tr '\n' ' ' | cut -c1-200)"
  done
done
