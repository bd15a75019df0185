"""nanovllm: a small offline LLM inference engine in the style of vLLM."""
from nanovllm.utils.logging_config import configure_logging

configure_logging()
from nanovllm.llm import LLM  # noqa: E402
from nanovllm.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "SamplingParams"]
