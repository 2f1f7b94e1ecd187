#!/usr/bin/env bash
# One call of a lent H200 (2026-11-29): prove HEAD first, then measure, each
# piece under the time left before END, everything archived at the end.
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
T0=$(date +%s); END=$((T0 + ${BUDGET:-565}))
R=/tmp/res; rm -rf $R; mkdir -p $R
left() { echo $(( END - $(date +%s) )); }
run() {  # name, seconds it needs at least, command...
  local name=$1 need=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt "$need" ]; then echo "== skip $name ($l s left)"; return; fi
  echo "== $name at $(( $(date +%s) - T0 )) s ($l s left)"
  timeout -s INT -k 10 "$l" "$@" > "$R/$name.log" 2>&1
  echo "   $name exit $? at $(( $(date +%s) - T0 )) s"
}
nvidia-smi > $R/nvidia-smi.txt 2>&1
cp COMMIT $R/ 2>/dev/null
run prove 300 bench/gpu_check.sh --only build,hopper,tests,verify,conv-tiles,memcheck,racecheck,synccheck $R/prove
run measure 60 bench/gpu_check.sh --only build,conv,gemm $R/measure
run train_resnet50 60 python3 -m mpgemm bench train --models resnet50 --batch-sizes 256 \
  --ways 'torch.amp,mpgemm,mpgemm fused' --profile --no-search --time-limit 50 --json $R/train_resnet50.json
run train_gpt2-block 40 python3 -m mpgemm bench train --models gpt2-block --batch-sizes 64 \
  --ways 'torch.amp,mpgemm,mpgemm fused' --profile --no-search --time-limit 30 --json $R/train_gpt2-block.json
run speed 45 bench/gpu_check.sh --only build,wgmma-speed,mlp,host $R/speed
run train_resnet50_epilogue_stats 30 env MPGEMM_EPILOGUE_STATS=1 python3 -m mpgemm bench train --models resnet50 \
  --batch-sizes 256 --ways 'torch.amp,mpgemm fused' --no-search --time-limit 20 --json $R/train_resnet50_epilogue_stats.json
tar czf $OUT/results.tar.gz -C $R .
for d in prove measure speed; do [ -f $R/$d/summary.md ] && cp $R/$d/summary.md $OUT/${d}_summary.md; done
echo "done at $(( $(date +%s) - T0 )) s"
