#!/usr/bin/env bash
# The scale validation's real runs (issue 30), in the order they ran on 2026-11-25 (second
# session): a reference point first and last (wisp, compute, N = 32, seed 0: the host's drift),
# the compute-bound regime's missing policies and seeds, then the memory-pressure regime (a KV
# cache of 4,096 tokens = 32 blocks of 128: ~16 devices' contexts) for every policy, seeds 0 and 1.
# Each step is resumable (validate keeps finished points). A CPU sampler logs each side's share.
#   bash experiments/data/validation-scale/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
D=experiments/data/validation-scale
SC=scenarios/validation-scale.yaml
python $D/cpu_sampler.py $D/cpu_run2.csv & SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null || true' EXIT
v() { wispsim validate $SC --arch mini-vllm "$@"; }
v --policies wisp --devices 32 --out $D/ref-start
v --policies centralized --devices 16,32,48,64 --out $D/seed0c
v --policies centralized,wisp-lru,sled --devices 16,32,48,64 --set seed=1 --out $D/seed1b
P=pressure:server.kv_capacity_tokens=4096
v --policies wisp,wisp-lru,fcfs,sled,centralized --devices 8,16,32 --regime $P --out $D/pressure-seed0
v --policies wisp,wisp-lru,fcfs,sled,centralized --devices 8,16,32 --regime $P --set seed=1 --out $D/pressure-seed1
v --policies wisp --devices 32 --out $D/ref-end
