"""Checkpoint loading: sharded files, packed modules, and clear errors instead of random weights."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import hf_greedy, make_tiny_model

from nanovllm import LLM, SamplingParams

KW = dict(kvcache_block_size=16, num_kvcache_blocks=32, max_model_len=128)


def shard_checkpoint(path):
    """Split model.safetensors into two shards with an index, as large checkpoints ship."""
    tensors = load_file(os.path.join(path, "model.safetensors"))
    os.remove(os.path.join(path, "model.safetensors"))
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for shard, shard_names in halves.items():
        save_file({n: tensors[n].contiguous() for n in shard_names}, os.path.join(path, shard),
                  metadata={"format": "pt"})
        weight_map.update({n: shard for n in shard_names})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return halves


def test_sharded_checkpoint_loads_and_matches_hf(tmp_path):
    hf = make_tiny_model(str(tmp_path))
    shard_checkpoint(str(tmp_path))
    out = LLM(str(tmp_path), **KW).generate([[3, 1, 4, 1, 5]], SamplingParams(temperature=0, max_tokens=10),
                                           use_tqdm=False)[0]
    assert out["token_ids"] == hf_greedy(hf, [3, 1, 4, 1, 5], 10)


def test_missing_shard_is_named(tmp_path):
    make_tiny_model(str(tmp_path))
    halves = shard_checkpoint(str(tmp_path))
    os.remove(os.path.join(tmp_path, "model-00002-of-00002.safetensors"))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        LLM(str(tmp_path), **KW)
    assert halves


def test_missing_tensor_is_named(tmp_path):
    make_tiny_model(str(tmp_path))
    path = os.path.join(tmp_path, "model.safetensors")
    tensors = load_file(path)
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"layers\.1\.self_attn\.qkv_proj\.weight\[k\]"):
        LLM(str(tmp_path), **KW)


def test_wrong_shape_is_named(tmp_path):
    make_tiny_model(str(tmp_path))
    path = os.path.join(tmp_path, "model.safetensors")
    tensors = load_file(path)
    tensors["model.layers.0.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="down_proj"):
        LLM(str(tmp_path), **KW)


def test_no_weights_at_all_is_an_error(tmp_path):
    make_tiny_model(str(tmp_path))
    os.remove(os.path.join(tmp_path, "model.safetensors"))
    with pytest.raises(FileNotFoundError, match="dummy"):
        LLM(str(tmp_path), **KW)


def test_untied_model_needs_its_lm_head(tmp_path):
    make_tiny_model(str(tmp_path), tie=False)
    path = os.path.join(tmp_path, "model.safetensors")
    tensors = load_file(path)
    del tensors["lm_head.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="lm_head.weight"):
        LLM(str(tmp_path), **KW)
