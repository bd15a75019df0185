"""Write sharegpt_format_sample.json: a small conversation set in ShareGPT's format, made for nanovllm.

It is NOT the ShareGPT dataset (which is large and not ours to ship): questions and answers about Python
are assembled from templates here, so that bench_sharegpt.py runs out of the box with realistic-looking
prompt and reply lengths. Pass the real file with `bench_sharegpt.py --dataset`.
"""
import json
import os
import random

TOPICS = ["list comprehensions", "decorators", "generators", "context managers", "dataclasses", "asyncio",
          "type hints", "the GIL", "virtual environments", "f-strings", "pathlib", "unit testing with pytest",
          "the logging module", "dictionaries", "exceptions", "iterators", "closures", "packaging a library",
          "profiling slow code", "regular expressions"]
ASKS = ["Can you explain {t} in Python?", "What are the common mistakes people make with {t}?",
        "Give me a short example of {t} and explain each line.", "How do {t} compare with what Java offers?",
        "I keep getting confused by {t}. Where should I start?", "Write a tutorial section about {t}."]
FACTS = ["Python favours readability, so the idiomatic form is usually the shortest clear one.",
         "The standard library already covers most everyday needs here.",
         "Measure before optimizing: the obvious version is often fast enough.",
         "Errors should never pass silently, so raise with a message that says what to fix.",
         "Keep functions small and give them names that say what they return.",
         "Tests pin behaviour down, which makes later refactoring safe.",
         "Explicit is better than implicit, especially in public interfaces.",
         "A short example teaches more than a long description."]


def conversation(rng: random.Random, i: int) -> dict:
    topic = rng.choice(TOPICS)
    ask = rng.choice(ASKS).format(t=topic)
    context = " ".join(rng.choice(FACTS) for _ in range(rng.randint(0, 6)))
    reply = f"Here is how {topic} work in practice. " + " ".join(rng.choice(FACTS)
                                                                 for _ in range(rng.randint(2, 40)))
    return {"id": f"nanovllm-sample-{i}", "conversations": [
        {"from": "human", "value": (context + " " + ask).strip()}, {"from": "gpt", "value": reply}]}


def main():
    rng = random.Random(0)
    data = [conversation(rng, i) for i in range(200)]
    path = os.path.join(os.path.dirname(__file__), "sharegpt_format_sample.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {len(data)} conversations to {path}")


if __name__ == "__main__":
    main()
