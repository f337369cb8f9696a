"""What tokenizing a text prompt costs an API server, per token (issue 36: a candidate for what the
calibration's per-arrival term stands for).

`vllm bench serve`'s random dataset sends text: random token ids decoded to a string, which the
API server tokenizes again before the engine sees the request; a verification round sends token
ids and skips this. Model hubs are unreachable here, so the tokenizer is a byte-level BPE of the
same kind as Qwen's and Llama-3's (Hugging Face ``tokenizers``, the Rust library vLLM's API server
runs), trained in a few seconds on this Python's standard-library sources (32,000 tokens against
Qwen's 151,643: encode time is mostly per byte, pre-tokenization and merges, so it is the same order
of magnitude, not the same number). For prompts of 256-4,096 tokens built as the random dataset
builds them (and, for comparison, source code), times ``Tokenizer.encode`` (median of 50).

    python benchmarks/vllm/tokenize_cost.py --out experiments/data/round-cost/tokenize.csv
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any


def train(vocab: int, files: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    paths = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
    text = []
    for p in paths[:files]:
        try:
            text.append(Path(p).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=vocab, show_progress=False))
    return tok, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("experiments/data/round-cost/tokenize.csv"))
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import pandas as pd
    import tokenizers

    tok, text = train(args.vocab, args.files)
    rng = random.Random(args.seed)
    rows = []
    for n in (256, 1024, 4096):
        random_text = tok.decode([rng.randrange(300, args.vocab) for _ in range(n)])
        code = "\n".join(text)[: n * 4]
        for kind, s in (("random-dataset", random_text), ("source-code", code)):
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                ids = tok.encode(s).ids
                times.append(time.perf_counter() - t0)
            ms = statistics.median(times) * 1e3
            rows.append({"kind": kind, "target_tokens": n, "tokens": len(ids), "chars": len(s),
                         "encode_ms": ms, "us_per_token": ms * 1e3 / len(ids)})  # fmt: skip
            print(f"{kind} {len(ids)} tokens: {ms:.3f} ms", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(args.out, index=False, float_format="%.5g")
    sys.path.insert(0, str(Path(__file__).parent))
    from round_cost import provenance

    prov: dict[str, Any] = provenance(args)
    prov["what"] = "API-server tokenization of a text prompt, per token (benchmarks/vllm/tokenize_cost.py)"
    prov["model"] = f"byte-level BPE, {args.vocab} tokens, trained on the stdlib sources (tokenizers)"
    prov["engine"] = f"tokenizers {tokenizers.__version__}, Tokenizer.encode, one thread"
    args.out.with_suffix(".json").write_text(json.dumps(prov, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
