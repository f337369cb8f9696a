"""Convert the Azure LLM inference traces of 2023 to wispsim's request-level arrival format.

Source: Azure/AzurePublicDataset (https://github.com/Azure/AzurePublicDataset), commit
b469a113cedca53ddc3bdea71a143dc4b7d8700c, files data/AzureLLMInferenceTrace_code.csv and
data/AzureLLMInferenceTrace_conv.csv (columns TIMESTAMP, ContextTokens, GeneratedTokens; one
hour of requests to Azure LLM inference services on 2023-11-16), licensed CC-BY 4.0. Cite:
Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024.

    python scripts/convert_azure_llm_traces.py --source DIR [--out traces]

DIR holds the two CSV files as published (download them from the repository above; the script
checks their SHA-256). Output: traces/azure-llm-2023-{code,conv}.csv with ``time_s`` (seconds
since the trace's first request), ``prompt_tokens`` (ContextTokens) and ``output_tokens``
(GeneratedTokens), behind ``#`` lines that carry the provenance. Nothing is dropped or clipped:
every row of the source has at least one context and one generated token.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import pandas as pd

COMMIT = "b469a113cedca53ddc3bdea71a143dc4b7d8700c"
FILES = {
    "code": (
        "AzureLLMInferenceTrace_code.csv",
        "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    ),
    "conv": (
        "AzureLLMInferenceTrace_conv.csv",
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
    ),
}


def convert(source: Path, out: Path) -> list[Path]:
    written = []
    for kind, (name, sha) in FILES.items():
        path = source / name
        if not path.is_file():
            sys.exit(f"convert_azure_llm_traces: {path}: not found (download it from {COMMIT[:7]})")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != sha:
            sys.exit(f"convert_azure_llm_traces: {path}: SHA-256 {digest}, expected {sha}")
        raw = pd.read_csv(path)
        stamp = pd.to_datetime(raw["TIMESTAMP"], format="%Y-%m-%d %H:%M:%S.%f")
        df = pd.DataFrame(
            {
                "time_s": ((stamp - stamp.min()).dt.total_seconds()).round(6),
                "prompt_tokens": raw["ContextTokens"].astype(int),
                "output_tokens": raw["GeneratedTokens"].astype(int),
            }
        )
        if not df.time_s.is_monotonic_increasing or (df[["prompt_tokens", "output_tokens"]] < 1).any().any():
            sys.exit(f"convert_azure_llm_traces: {path}: unexpected content (unsorted, or empty requests)")
        dst = out / f"azure-llm-2023-{kind}.csv"
        header = [
            f"# Azure LLM inference trace 2023 ({kind}), converted to time_s,prompt_tokens,output_tokens",
            f"# source: github.com/Azure/AzurePublicDataset@{COMMIT} data/{name} (sha256 {sha})",
            f"# first request {stamp.min()} (time_s = 0); {len(df)} requests over {df.time_s.max():.0f} s",
            "# license: CC-BY 4.0 (traces/LICENSE-azure-llm-2023); cite Patel et al., Splitwise, ISCA 2024",
            "# converted by scripts/convert_azure_llm_traces.py",
        ]
        dst.write_text("\n".join(header) + "\n" + df.to_csv(index=False))
        written.append(dst)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True, help="folder holding the two published CSV files")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "traces")
    args = ap.parse_args()
    for p in convert(args.source, args.out):
        print(p)


if __name__ == "__main__":
    main()
