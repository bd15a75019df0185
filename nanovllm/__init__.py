"""nanovllm: a small offline LLM inference engine in the style of vLLM."""
from nanovllm.llm import LLM
from nanovllm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
