"""The public facade: `LLM(model, **settings).generate(prompts, sampling_params)`."""
from nanovllm.engine.llm_engine import LLMEngine
from nanovllm.sampling_params import SamplingParams


class LLM(LLMEngine):
    """Offline batch inference; settings are vLLM's (see nanovllm.config.Config)."""

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None,
             use_tqdm: bool = True, chat_template_kwargs: dict | None = None) -> list[dict]:
        """One conversation (a list of {'role', 'content'}) or several; the tokenizer's chat template
        turns each into a prompt that ends where the assistant's reply starts. chat_template_kwargs go to
        the template, as in vLLM (e.g. {"enable_thinking": False} for Qwen3)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        for i, conversation in enumerate(conversations):
            check_conversation(conversation, i)
        if self.tokenizer is None:
            raise ValueError("this model directory has no tokenizer (and so no chat template); use generate")
        prompts = [self.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True,
                                                      **(chat_template_kwargs or {}))
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)


ROLES = ("system", "user", "assistant", "tool")


def check_conversation(conversation, index: int) -> None:
    """ValueError unless the conversation is a non-empty list of {'role': one of ROLES, 'content': str}."""
    if not isinstance(conversation, (list, tuple)) or not conversation:
        raise ValueError(f"conversation {index} must be a non-empty list of messages, got {conversation!r}")
    for j, message in enumerate(conversation):
        if not isinstance(message, dict) or message.get("role") not in ROLES or \
                not isinstance(message.get("content"), str):
            raise ValueError(f"conversation {index}, message {j}: a message is {{'role': one of {list(ROLES)}, "
                             f"'content': a string}}, got {message!r}")
