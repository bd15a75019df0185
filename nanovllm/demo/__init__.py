"""The demo: a tiny Qwen3 trained on the Zen of Python, committed so example.py runs anywhere."""
import os

DEMO_MODEL_DIR = os.path.join(os.path.dirname(__file__), "zen-qwen3")
