"""The package's import graph: no circles, and no import from a lower layer to a higher one
(../shared/ARCHITECTURE.md: entry points > engine > settings > models > layers > attention > quant > utils)."""
import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nanovllm")
# lowest first; anything else (llm, tools, demo, data) is an entry point, above them all
LAYERS = [("utils",), ("quant",), ("attention",), ("layers",), ("models",),
          ("config", "sampling_params", "outputs", "configs"), ("engine",)]
TOOLS = {"nanovllm.quant.awq_quantize"}   # a CLI kept beside the format it writes: an entry point


def module_imports() -> dict[str, set[str]]:
    """Module -> the nanovllm modules it imports anywhere in its file (function-level imports too)."""
    modules = {}
    for folder, _, files in os.walk(ROOT):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                modules[rel.removesuffix(".__init__")] = path
    graph = {}
    for module, path in modules.items():
        with open(path) as f:
            tree = ast.parse(f.read())
        targets = set()
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            targets |= {n for n in names if n in modules and n != module}
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    if module in TOOLS or len(parts) < 2:
        return len(LAYERS)
    return next((i for i, names in enumerate(LAYERS) if parts[1] in names), len(LAYERS))


def test_no_import_cycles():
    assert cycles(module_imports()) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_run_downward():
    upward = [(m, t) for m, targets in module_imports().items() for t in targets if layer(t) > layer(m)]
    assert upward == []


def test_ruff_is_clean():
    """pyproject.toml's [tool.ruff] rules hold everywhere (pyflakes, pycodestyle, import order)."""
    import subprocess
    import sys
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", repo], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


def test_backends_and_linear_methods_declare_their_interfaces():
    """Every attention backend and linear method has what its Protocol lists (attributes and methods)."""
    import importlib
    import typing

    from nanovllm.attention.backend import _BACKENDS, AttentionBackend
    from nanovllm.layers.linear import LinearMethod, UnquantizedLinearMethod
    from nanovllm.quant.awq_method import AWQConfig, AWQLinearMethod
    backends = [("nanovllm.attention.torch_ref", "TorchBackend"),
                ("nanovllm.attention.triton_backend", "TritonBackend")]
    assert set(backends) < set(_BACKENDS.values())       # flash_attn is optional: checked by name below
    for module, cls in backends:
        backend = getattr(importlib.import_module(module), cls)()
        assert isinstance(backend, AttentionBackend), cls
    names = set(typing.get_type_hints(AttentionBackend)) | {"plan_decode", "kv_cache_shape", "store_kv", "forward"}
    with open(os.path.join(ROOT, "attention", "flash_attn_backend.py")) as f:
        source = f.read()
    assert all(name in source for name in names)
    for method in (UnquantizedLinearMethod(), AWQLinearMethod(AWQConfig(group_size=128))):
        assert isinstance(method, LinearMethod), type(method).__name__
