"""SamplingParams' vLLM options against transformers' logits processors (same weights, greedy ids equal):
repetition_penalty, bad_words, logit_bias, min_tokens; presence/frequency penalties against a plain
greedy loop over transformers' logits; n > 1 (parallel samples sharing the prompt's blocks)."""
import dataclasses

import pytest
import torch
from tiny_models import make_tiny_model

from nanovllm import LLM, SamplingParams

PROMPTS = [[5, 9, 200, 31, 31, 7], [250, 3] * 9, [17]]
MAX_TOKENS = 16
EOS = 256


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("options"))
    hf = make_tiny_model(path)
    return LLM(path, kvcache_block_size=16, num_kvcache_blocks=96, max_model_len=256), hf


def ours(llm, **kw):
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, **kw)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def theirs(hf, **kw):
    outs = []
    for prompt in PROMPTS:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                              do_sample=False, max_new_tokens=MAX_TOKENS, pad_token_id=EOS, **kw)
        outs.append(out[0, len(prompt):].tolist())
    return outs


def test_repetition_penalty_equals_transformers(pair):
    llm, hf = pair
    assert ours(llm) == theirs(hf)        # the oracle agrees without the option...
    got = ours(llm, repetition_penalty=1.8)
    assert got == theirs(hf, repetition_penalty=1.8)
    assert got != ours(llm)               # ...and the option changes the tokens


def test_bad_words_equal_transformers(pair):
    llm, hf = pair
    plain = ours(llm)

    def printable(t):
        return 33 <= t < 127          # one byte, one token of the byte tokenizer

    one = next(t for t in plain[0] if printable(t))                                   # a 1-token word
    two = next(plain[1][i:i + 2] for i in range(MAX_TOKENS - 1) if all(map(printable, plain[1][i:i + 2])))
    words = [chr(one), bytes(two).decode()]
    ids = llm.bad_words_ids(words)
    assert [one] in ids and two in ids and [32, one] in ids
    got = ours(llm, bad_words=words)
    assert got == theirs(hf, bad_words_ids=ids) and got != plain


def test_logit_bias_and_min_tokens_equal_transformers(pair):
    llm, hf = pair
    bias = {EOS: 30.0, 42: 5.0}
    got = ours(llm, logit_bias=bias, min_tokens=5)
    want = theirs(hf, sequence_bias={(t,): b for t, b in bias.items()}, min_new_tokens=5)
    # the engine stops at EOS and returns it; transformers pads after it
    assert got == [w[:w.index(EOS) + 1] if EOS in w else w for w in want]
    assert all(len(g) == 6 and g[-1] == EOS for g in got)


def test_presence_and_frequency_penalties_equal_a_plain_loop(pair):
    llm, hf = pair
    presence, frequency = 0.7, 1.3
    want = []
    for prompt in PROMPTS:
        ids, out = list(prompt), []
        for _ in range(MAX_TOKENS):
            with torch.no_grad():
                logits = hf(torch.tensor([ids])).logits[0, -1].float()
            counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=logits.shape[0]).float()
            token = int((logits - frequency * counts - presence * (counts > 0).float()).argmax())
            out.append(token)
            ids.append(token)
            if token == EOS:
                break
        want.append(out)
    got = ours(llm, presence_penalty=presence, frequency_penalty=frequency)
    assert got == want and got != ours(llm)


def test_logprobs_stay_the_models_own_under_processors(pair):
    llm, _ = pair
    plain = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=1, logprobs=0), use_tqdm=False)[0]
    biased = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=1, logprobs=0,
                                                     logit_bias={plain["token_ids"][0]: -100}), use_tqdm=False)[0]
    token = biased["token_ids"][0]
    assert token != plain["token_ids"][0]
    assert biased["logprobs"][0][token] < plain["logprobs"][0][plain["token_ids"][0]]   # raw, not biased


def test_n_samples_share_the_prompt_and_follow_their_seeds(pair):
    llm, _ = pair
    prompt = list(range(40))                         # 2 full blocks of 16, then 8 tokens
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8)
    llm.stats = dict.fromkeys(llm.stats, 0)
    assert llm.reset_prefix_cache()
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert llm.stats["prefill_tokens"] == 40 + 2 * 8   # the later samples compute only the last block
    for j, completion in enumerate(out.outputs):
        alone = llm.generate(prompt, SamplingParams(temperature=1.0, seed=7 + j, max_tokens=8), use_tqdm=False)[0]
        assert completion.token_ids == alone["token_ids"]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    assert out["token_ids"] == out.outputs[0].token_ids          # the dict keys are the first completion's


@pytest.mark.parametrize("kw, match", [(dict(n=0), "n must"), (dict(presence_penalty=3), "presence_penalty"),
                                       (dict(repetition_penalty=0), "repetition_penalty"),
                                       (dict(logit_bias={"x": 1}), "logit_bias"), (dict(bad_words=[""]), "bad_words"),
                                       (dict(min_tokens=20, max_tokens=10), "min_tokens")])
def test_bad_options_say_what_is_allowed(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_an_unknown_option_lists_the_valid_ones():
    with pytest.raises(TypeError, match="valid ones are .*repetition_penalty"):
        SamplingParams(best_of=2)


def test_detokenize_and_special_tokens(pair):
    llm, _ = pair
    eos_first = SamplingParams(temperature=0, max_tokens=3, logit_bias={EOS: 100.0}, ignore_eos=True)
    kept = llm.generate(PROMPTS[0], dataclasses.replace(eos_first, skip_special_tokens=False), use_tqdm=False)[0]
    skipped = llm.generate(PROMPTS[0], eos_first, use_tqdm=False)[0]
    assert kept["token_ids"] == skipped["token_ids"] == [EOS] * 3
    assert skipped["text"] == "" and kept["text"] == llm.tokenizer.decode([EOS] * 3) != ""
    silent = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, detokenize=False), use_tqdm=False)
    assert silent[0]["text"] == "" and len(silent[0]["token_ids"]) == 4
    with pytest.raises(ValueError, match="detokenize"):
        SamplingParams(stop=["x"], detokenize=False)
