#!/usr/bin/env bash
# The second call (2026-11-29): the fixes proven, the crash's traceback.
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
T0=$(date +%s); END=$((T0 + ${BUDGET:-290}))
R=/tmp/res; rm -rf $R; mkdir -p $R
left() { echo $(( END - $(date +%s) )); }
run() {
  local name=$1 need=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt "$need" ]; then echo "== skip $name ($l s left)"; return; fi
  echo "== $name at $(( $(date +%s) - T0 )) s ($l s left)"
  timeout -s INT -k 10 "$l" "$@" > "$R/$name.log" 2>&1
  echo "   $name exit $? at $(( $(date +%s) - T0 )) s"
}
cp COMMIT $R/
run build 150 bash -c 'TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=$(nproc) python3 setup.py build_ext --inplace'
run scaler 40 env OMP_NUM_THREADS=4 timeout 60 python3 -X faulthandler -m pytest -p no:xdist -p no:cacheprovider -q -rA tests/amp/test_scaler_on_device.py
run tests 60 env OMP_NUM_THREADS=2 python3 -m pytest -m gpu -q -rs -p no:cacheprovider tests -n 8 --junitxml $R/tests.xml
tar czf $OUT/results2.tar.gz -C $R .
grep -h "passed\|failed\|FAILED\|Fatal\|File \"/work" $R/scaler.log | head -40
tail -40 $R/tests.log
echo "done at $(( $(date +%s) - T0 )) s"
