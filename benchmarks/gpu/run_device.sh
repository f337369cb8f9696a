#!/usr/bin/env bash
# One prepared device check (docs/profiles.md, "measured on a GPU"): the roofline's shapes timed
# with random weights (benchmarks/gpu/kernels.py; KERNEL_BUDGET_S=0 skips it where this GPU's
# kernels are already recorded), issue 45's shapes (shapes_2026.py), then verification batches of
# random-weight models (RECORD_ARCHS, default llama-2-7b) through `wispsim profile record --device
# cuda` (the hf engine, packed varlen attention; SDPA per request where varlen fails). Writes
# everything under $OUT; run from the repository root on the GPU machine, with simpy's wheel in
# .whl/ (the image has wispsim's other dependencies).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to the folder results go to}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
if [ "${KERNEL_BUDGET_S:-200}" != 0 ]; then
  python3 benchmarks/gpu/kernels.py --out "$OUT" --budget-s "${KERNEL_BUDGET_S:-200}" 2>&1 | tee "$OUT/kernels.log"
fi
# issue 45's shapes: expert GEMMs, routing, fp8 GEMMs, LM head and sampling over a vocabulary, MLA decode
python3 benchmarks/gpu/shapes_2026.py --out "$OUT" --budget-s "${SHAPES_BUDGET_S:-120}" 2>&1 | tee "$OUT/shapes_2026.log"
python3 -m wispsim.cli profile plan --out "$OUT/plan.csv" --counts 12,16,6,6,8 --test 16 --max-context 4096 --seed 0 2>&1 | tail -3
for arch in ${RECORD_ARCHS:-llama-2-7b}; do
  for attention in varlen loop; do  # loop: SDPA per request, where varlen is unavailable
    csv="$OUT/record-$attention-$arch.csv"
    timeout "${RECORD_BUDGET_S:-150}" python3 -m wispsim.cli profile record --plan "$OUT/plan.csv" --out "$csv" \
      --engine hf --arch "$arch" --random-weights --device cuda --dtype bfloat16 --attention $attention \
      --warmup 5 --runs 5 2>&1 | grep -v "━" | tee "$OUT/record-$attention-$arch.log" | tail -20
    [ "$(wc -l < "$csv" 2>/dev/null || echo 0)" -ge 3 ] && break
  done
done
ls -la "$OUT"
