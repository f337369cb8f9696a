"""Random-weight SmolLM2-135M (wispsim/data/archs/smollm2-135m.yaml; or the architecture named by
the second argument, e.g. mini-vllm), float32, with a word-level tokenizer covering its whole
vocabulary (as tests/serve/test_openai_endpoint.py builds its tiny model).

    python experiments/data/validation-sd/make_model.py OUT [ARCH]"""

import json
import sys
from pathlib import Path

import torch
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

name = sys.argv[2] if len(sys.argv) > 2 else "smollm2-135m"
arch = yaml.safe_load(Path(f"wispsim/data/archs/{name}.yaml").read_text())
keys = [
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tie_word_embeddings",
    "attention_bias",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
]
V = arch["vocab_size"]
cfg = LlamaConfig(
    **{k: arch[k] for k in keys}, eos_token_id=0, pad_token_id=0, bos_token_id=0, torch_dtype="float32"
)
torch.manual_seed(0)
path = Path(sys.argv[1])
LlamaForCausalLM(cfg).save_pretrained(path)
tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w1"))
tk.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="w1", eos_token="w0", pad_token="w0")
fast.save_pretrained(path)
tc = path / "tokenizer_config.json"
tc.write_text(json.dumps({**json.loads(tc.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"}))
print(path)
