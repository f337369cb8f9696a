#!/usr/bin/env bash
# One prepared device check (docs/profiles.md, "measured on a GPU"): the roofline's shapes timed
# with random weights (benchmarks/gpu/kernels.py), then verification batches of a random-weight
# Llama-2-7B through `wispsim profile record --device cuda` (the hf engine, packed varlen
# attention). Writes everything under $OUT; run from the repository root on the GPU machine,
# with simpy's wheel in .whl/ (the image has wispsim's other dependencies).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:?set OUT to the folder results go to}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 benchmarks/gpu/kernels.py --out "$OUT" --budget-s "${KERNEL_BUDGET_S:-200}" 2>&1 | tee "$OUT/kernels.log"
# issue 45's shapes: expert GEMMs, routing, LM head and sampling over a vocabulary, MLA decode
python3 benchmarks/gpu/shapes_2026.py --out "$OUT" --budget-s "${SHAPES_BUDGET_S:-120}" 2>&1 | tee "$OUT/shapes_2026.log"
python3 -m wispsim.cli profile plan --out "$OUT/plan.csv" --counts 12,16,6,6,8 --test 16 --max-context 4096 --seed 0 2>&1 | tail -3
timeout "${RECORD_BUDGET_S:-150}" python3 -m wispsim.cli profile record --plan "$OUT/plan.csv" --out "$OUT/record.csv" \
  --engine hf --arch llama-2-7b --random-weights --device cuda --dtype bfloat16 --attention varlen \
  --warmup 5 --runs 5 2>&1 | grep -v "━" | tee "$OUT/record.log" | tail -20
ls -la "$OUT"
if [ "$(wc -l < "$OUT/record.csv" 2>/dev/null || echo 0)" -lt 3 ]; then  # varlen unavailable: SDPA per request
  timeout "${RECORD_BUDGET_S:-150}" python3 -m wispsim.cli profile record --plan "$OUT/plan.csv" --out "$OUT/record.csv" \
    --engine hf --arch llama-2-7b --random-weights --device cuda --dtype bfloat16 --attention loop \
    --warmup 5 --runs 5 2>&1 | grep -v "━" | tee "$OUT/record.log" | tail -20
fi
