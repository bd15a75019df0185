"""The public facade: `LLM(model, **settings).generate(prompts, sampling_params)`."""
from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.sampling_params import SamplingParams


class LLM(LLMEngine):
    """Offline batch inference; settings are vLLM's (see nanovllm.config.Config)."""

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True) -> list[dict]:
        """One conversation (a list of {'role', 'content'}) or several; the tokenizer's chat template
        turns each into a prompt that ends where the assistant's reply starts."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)
