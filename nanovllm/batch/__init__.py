"""Batch files in, results out: the OpenAI Batch format (openai_format.py) and Ray Data replicas (ray_data.py)."""
