#!/usr/bin/env bash
# centralized and centralized-sd at the scale regime (issue 30, "server-side speculation, if the
# previous issue made it real on this backend": it runs through `vllm serve`, whose engine core
# lives in a process of its own). `vllm serve` of random-weight mini-vllm (make_model.py), plain
# and drafting for itself (draft_model, the same weights, 3 tokens: every draft accepted under
# greedy decoding), driven by `wispsim validate --openai-url` with scenarios/validation-scale.yaml.
# Simulated: centralized priced by a steps profile fitted on the plain run (calibration);
# centralized-sd by the same profile for the target and the draft (held out).
#   bash experiments/data/validation-scale/sd.sh [DEVICES] [SEED]
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=experiments/data/validation-scale/sd
DEV=${1:-16,32,48}
SEED=${2:-0}
mkdir -p "$OUT"
MODEL=/tmp/wispsim-mini-random
[ -d "$MODEL" ] || python experiments/data/validation-sd/make_model.py "$MODEL" mini-vllm
PORT=8123
serve() {  # start vllm serve with extra args; wait for /health
  VLLM_CPU_KVCACHE_SPACE=1 setsid python -m vllm.entrypoints.openai.api_server --model "$MODEL" \
    --served-model-name mini-random --port $PORT --max-model-len 1024 --dtype float32 \
    --enforce-eager "$@" > "$OUT/vllm-$NAME-seed$SEED.log" 2>&1 &
  PID=$!
  for _ in $(seq 240); do curl -sf localhost:$PORT/health >/dev/null && return; sleep 1; done
  echo "vllm serve did not start" >&2; exit 1
}
stop() { kill -TERM -- -"$PID" 2>/dev/null || true; sleep 5; kill -KILL -- -"$PID" 2>/dev/null || true; }
trap stop EXIT
# first simulated side: the profile recorded in the server's process (chosen on purpose: no profile
# of mini-vllm was recorded in vllm serve's layout); the steps profile fitted on plain follows
COMMON=(--devices "$DEV" --set seed="$SEED" --sim-set server.profile=cpu-vllm-mini-inproc)
NAME=plain; serve
wispsim validate scenarios/validation-scale.yaml --openai-url http://127.0.0.1:$PORT/v1 \
  --policies centralized "${COMMON[@]}" --out "$OUT/plain-seed$SEED"
stop
SPEC="$OUT/validation-scale-sd.yaml"
{ cat scenarios/validation-scale.yaml; echo "policy: centralized-sd"; } > "$SPEC"
NAME=draft; serve --speculative-config \
  "{\"method\":\"draft_model\",\"model\":\"$MODEL\",\"num_speculative_tokens\":3}"
wispsim validate "$SPEC" --openai-url http://127.0.0.1:$PORT/v1 --policies centralized-sd "${COMMON[@]}" \
  --set server.speculation.method=draft --set server.speculation.k=3 \
  --set server.speculation.draft_profile=cpu-vllm-mini-inproc --set server.speculation.acceptance_length=4 \
  --out "$OUT/draft-seed$SEED"
stop
GPU="CPU: AMD EPYC, AVX-512 (vllm serve: engine core in its own process)"
STEPS=profiles/cpu-vllm-mini-serve-steps.yaml
[ -f $STEPS ] || wispsim profile fit "$OUT/plain-seed0/points/compute/centralized" --batch-kind step \
  --out $STEPS --gpu "$GPU" --bootstrap 200 --no-plots
wispsim validate scenarios/validation-scale.yaml --policies centralized "${COMMON[@]}" \
  --real-from "$OUT/plain-seed$SEED" --sim-set server.profile=cpu-vllm-mini-serve-steps --out "$OUT/plain-seed$SEED-steps"
wispsim validate "$SPEC" --policies centralized-sd "${COMMON[@]}" --set server.speculation.method=draft \
  --set server.speculation.k=3 --set server.speculation.acceptance_length=4 \
  --real-from "$OUT/draft-seed$SEED" --sim-set server.profile=cpu-vllm-mini-serve-steps \
  --sim-set server.speculation.draft_profile=cpu-vllm-mini-serve-steps --out "$OUT/draft-seed$SEED-steps"
