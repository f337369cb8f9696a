#!/usr/bin/env bash
# The session-resident verifier against the re-submitting one on the real deployment at the
# issue-30 scale (experiments/validation-resident.yaml): WISP, compute-bound, N = 8-64, seed 0,
# both kinds one after the other in one host session. ~25 minutes on 2 cores; run it alone.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=experiments/data/validation-resident
for kind in resubmit resident; do
  wispsim validate scenarios/validation-scale.yaml --arch mini-vllm --policies wisp \
    --devices 8,16,32,48,64 --set server.verifier=$kind --out $out/$kind
done
