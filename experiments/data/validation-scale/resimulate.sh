#!/usr/bin/env bash
# Host B's deployed side (issue 30): the real points run.sh stored, simulated again with the
# profiles fitted on host B's own calibration runs -- verification batches of the first reference
# point (wisp, compute, N = 32, seed 0: profiles/cpu-vllm-mini-deployed-hostb.yaml) and
# centralized engine steps of compute seed 0 (profiles/cpu-vllm-mini-steps-hostb.yaml). The
# simulated schedulers plan with the profile the real server planned with (validate sets
# server.planning_profile itself when --sim-set changes server.profile).
#   bash experiments/data/validation-scale/resimulate.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=experiments/data/validation-scale
SC=scenarios/validation-scale.yaml
GPU="CPU: AMD EPYC, AVX-512 (vLLM: 1 compute core of 2)"
[ -f profiles/cpu-vllm-mini-steps-hostb.yaml ] || wispsim profile fit $D/seed0c/points/compute/centralized \
  --batch-kind step --out profiles/cpu-vllm-mini-steps-hostb.yaml --gpu "$GPU" --bootstrap 200 --no-plots
DEP=(--sim-set server.profile=cpu-vllm-mini-deployed-hostb --sim-set centralized:server.profile=cpu-vllm-mini-steps-hostb)
P=pressure:server.kv_capacity_tokens=4096
r() { wispsim validate $SC "$@" "${DEP[@]}"; }
r --policies centralized --devices 16,32,48,64 --real-from $D/seed0c --out $D/seed0c-deployed
r --policies centralized,wisp-lru,sled --devices 16,32,48,64 --set seed=1 --real-from $D/seed1b --out $D/seed1b-deployed
for s in 0 1; do
  r --policies wisp,wisp-lru,fcfs,sled,centralized --devices 8,16,32 --regime $P --set seed=$s \
    --real-from $D/pressure-seed$s --out $D/pressure-seed$s-deployed
done
