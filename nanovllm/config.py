"""Every engine setting in one validated dataclass (vLLM's names)."""
import json
import logging
import os
from dataclasses import dataclass, field, fields

import torch

from nanovllm.models import check_architecture
from nanovllm.quant.awq_method import read_awq_config
from nanovllm.quant.kv import KV_CACHE_DTYPES

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "half": torch.float16,
          "float": torch.float32}
DEVICES = ("auto", "cuda", "cpu")
LOAD_FORMATS = ("auto", "dummy")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")
QUANTIZATIONS = (None, "awq", "awq_marlin")    # vLLM's names for an AWQ checkpoint; None: as the checkpoint says


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding by prompt lookup, as vLLM's `speculative_config={"method": "ngram", ...}`: the
    last n tokens of a sequence (n from prompt_lookup_max down to prompt_lookup_min) are looked up earlier in
    it, and the k tokens that followed are proposed. Steps with more running sequences than
    disable_by_batch_size decode without proposals (their batch is large enough to keep the GPU busy)."""
    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_max: int = 5
    prompt_lookup_min: int = 5
    disable_by_batch_size: int | None = None

    @classmethod
    def from_dict(cls, value: dict) -> "SpeculativeConfig":
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict such as {{'method': 'ngram', "
                             f"'num_speculative_tokens': 4}}, got {type(value).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"speculative_config has unknown key(s) {unknown}; known ones are {known}")
        _choice("speculative_config['method']", value.get("method", "ngram"), ("ngram",))
        settings = dict(value)
        if "num_speculative_tokens" not in settings:
            raise ValueError("speculative_config needs 'num_speculative_tokens' (draft tokens per step, e.g. 4)")
        # one of prompt_lookup_min/max given sets the other; neither: 5 and 5
        lo, hi = settings.get("prompt_lookup_min"), settings.get("prompt_lookup_max")
        settings["prompt_lookup_min"] = lo if lo is not None else (hi if hi is not None else 5)
        settings["prompt_lookup_max"] = hi if hi is not None else settings["prompt_lookup_min"]
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size"):
            v = settings.get(name)
            if v is None and name == "disable_by_batch_size":
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"speculative_config['{name}'] must be an integer >= 1, got {v!r}")
        if settings["prompt_lookup_min"] > settings["prompt_lookup_max"]:
            raise ValueError(f"speculative_config: prompt_lookup_min={settings['prompt_lookup_min']} is over "
                             f"prompt_lookup_max={settings['prompt_lookup_max']}")
        return cls(**settings)


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {list(allowed)}")


@dataclass
class Config:
    """Engine settings; `LLM(model, **kwargs)` builds one and validates it.

    max_num_batched_tokens (tokens per step, decodes and prefill chunks together) and max_num_seqs (seats:
    sequences running at once) default to vLLM's values for GPUs of 70 GiB or more, 16384 and 1024. An
    offline batch holds more requests than seats; more seats keep the decode batch large while newcomers'
    prefills ride along (measured with bench.py --workload short: docs/features/engine/engine.md). Each
    seat costs a KV block only while in use; on smaller caches the scheduler preempts instead.
    """
    model: str
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 1024
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.9
    kvcache_block_size: int = 256
    num_kvcache_blocks: int = -1          # -1: size the cache from memory
    cpu_kvcache_space_gib: float = 1.0    # KV cache size on CPU (vLLM: VLLM_CPU_KVCACHE_SPACE)
    enforce_eager: bool = False
    tensor_parallel_size: int = 1
    dtype: str | torch.dtype = "auto"
    device: str = "auto"
    load_format: str = "auto"
    seed: int = 0
    attention_backend: str = "auto"
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    enable_cascade_attention: bool = True    # decode reads a prefix that running sequences share through the
                                             # prefix cache once per step (Triton backend; vLLM's default too)
    speculative_config: dict | SpeculativeConfig | None = None   # {"method": "ngram", ...}: SpeculativeConfig
    quantization: str | None = None          # vLLM's: the checkpoint's method, checked against it (check_quantization)
    tokenizer: str | None = None             # a tokenizer directory other than the model's
    trust_remote_code: bool = False          # passed to transformers' config and tokenizer loaders, as vLLM does
    hf_config: object = field(default=None, repr=False)
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        self.model = os.path.expanduser(self.model)
        if not os.path.isdir(self.model):
            hint = ""
            if self.model.count("/") == 1 and not self.model.startswith((".", "/", "~")):
                hint = (f"; nanovllm reads local directories only (no model hub): download it first, e.g. "
                        f"`huggingface-cli download {self.model} --local-dir ~/huggingface/{self.model.split('/')[1]}`"
                        f", and pass that directory")
            raise ValueError(f"model={self.model!r} is not a directory holding config.json{hint}")
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "tensor_parallel_size",
                     "kvcache_block_size", "num_kvcache_blocks", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "tensor_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("enforce_eager", "enable_prefix_caching", "enable_cascade_attention", "trust_remote_code"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kvcache_block_size < 1 or self.kvcache_block_size % 16:
            raise ValueError(f"kvcache_block_size must be a positive multiple of 16, got {self.kvcache_block_size}")
        if self.num_kvcache_blocks != -1 and self.num_kvcache_blocks < 1:
            raise ValueError(f"num_kvcache_blocks must be -1 (auto) or >= 1, got {self.num_kvcache_blocks}")
        _choice("device", self.device, DEVICES)
        _choice("load_format", self.load_format, LOAD_FORMATS)
        _choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        _choice("quantization", self.quantization, QUANTIZATIONS)
        if self.tokenizer is not None:
            self.tokenizer = os.path.expanduser(self.tokenizer)
            if not os.path.isdir(self.tokenizer):
                raise ValueError(f"tokenizer={self.tokenizer!r} is not a directory (one holding tokenizer files)")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for but CUDA is not available; use device='cpu' or 'auto'")
        if self.device == "cuda" and self.tensor_parallel_size > torch.cuda.device_count():
            raise ValueError(f"tensor_parallel_size={self.tensor_parallel_size} needs that many GPUs, "
                             f"{torch.cuda.device_count()} visible; set CUDA_VISIBLE_DEVICES or use device='cpu'")
        if self.speculative_config is not None and not isinstance(self.speculative_config, SpeculativeConfig):
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        self.hf_config = load_hf_config(self.model, self.trust_remote_code)
        check_quantization(self.quantization, self.model, self.hf_config)
        self.dtype = resolve_dtype(self.dtype, self.hf_config)
        if self.max_model_len > self.hf_config.max_position_embeddings:
            logger.warning("max_model_len=%d is over the model's max_position_embeddings=%d: using %d",
                           self.max_model_len, self.hf_config.max_position_embeddings,
                           self.hf_config.max_position_embeddings)
            self.max_model_len = self.hf_config.max_position_embeddings
        check_architecture(self.hf_config, self.max_model_len)
        self.eos_token_ids = tuple(self.eos_token_ids) or read_eos_token_ids(self.model, self.hf_config)
        _check_divides(self.tensor_parallel_size, self.hf_config)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("model", "hf_config")]


def load_hf_config(model_dir: str, trust_remote_code: bool = False):
    from transformers import AutoConfig
    return AutoConfig.from_pretrained(model_dir, trust_remote_code=trust_remote_code)


def check_quantization(quantization: str | None, model_dir: str, hf_config) -> None:
    """vLLM scripts name the checkpoint's quantization (`quantization="awq"`); nanovllm reads it from the
    checkpoint and quantizes nothing at load, so a name given must be the checkpoint's. "awq_marlin" (vLLM's
    faster AWQ kernels) is taken as "awq": nanovllm picks its AWQ kernels per layer shape by measurement."""
    if quantization is not None and read_awq_config(model_dir, hf_config) is None:
        raise ValueError(f"quantization={quantization!r}, but {model_dir} is not an AWQ checkpoint (config.json has "
                         f"no quantization_config) and nanovllm does not quantize at load: make one with `python -m "
                         f"nanovllm.quant.awq_quantize --model DIR --out DIR`, or leave quantization unset")


def resolve_dtype(dtype: str | torch.dtype, hf_config) -> torch.dtype:
    """'auto' follows the checkpoint (bf16 stays bf16); float32 checkpoints stay float32."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"dtype={dtype} is not supported; choose one of {sorted(set(DTYPES))} or 'auto'")
        return dtype
    if dtype == "auto":
        stored = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or torch.bfloat16
        return DTYPES[stored] if isinstance(stored, str) else stored
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; choose one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def read_eos_token_ids(model_dir: str, hf_config) -> tuple[int, ...]:
    """EOS ids from config.json, generation_config.json and the tokenizer config (there may be several)."""
    ids: set[int] = set()

    def add(value):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))

    add(getattr(hf_config, "eos_token_id", None))
    gen_path = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(gen_path):
        with open(gen_path) as f:
            add(json.load(f).get("eos_token_id"))
    return tuple(sorted(ids))


def _check_divides(tp: int, hf_config) -> None:
    heads, kv_heads = hf_config.num_attention_heads, hf_config.num_key_value_heads
    if heads % tp:
        raise ValueError(f"tensor_parallel_size={tp} must divide num_attention_heads={heads}")
    if kv_heads % tp and tp % kv_heads:
        raise ValueError(f"tensor_parallel_size={tp} must divide num_key_value_heads={kv_heads} "
                         f"or be a multiple of it (KV heads are then replicated)")
