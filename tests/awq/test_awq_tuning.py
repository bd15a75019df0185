"""AWQ kernel choice: the measured table (benchmarks/bench_gemm.py --write) that awq_gemm and awq_gemv follow,
and the defaults without one."""
import json

import pytest
import torch


def test_measured_fastest_method_is_followed(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from benchmarks.bench_gemm import fastest_methods
    from nanovllm.quant import triton_awq
    rows = [{"tokens": m, "fused_us": f, "gemv_us": g, "dequant_matmul_us": d}
            for m, f, g, d in [(1, 5.0, 3.0, 9.0), (1, 5.0, 4.0, 9.0), (64, 8.0, None, 7.0), (64, 9.0, None, 9.0)]]
    fastest = fastest_methods(rows)
    assert fastest == {"1": "gemv", "64": "dequant"}     # totals over layers: 10 vs 7 vs 18; 17 vs 16
    monkeypatch.setattr(triton_awq, "TUNED_DIR", str(tmp_path))
    triton_awq.tuned_methods.cache_clear()
    with open(triton_awq.tuned_methods_path("Some GPU"), "w") as f:
        json.dump({"fastest": fastest}, f)
    table = triton_awq.tuned_methods("Some GPU")
    assert [triton_awq.pick_method(m, table) for m in (1, 2, 64, 5000)] == ["gemv", "dequant", "dequant", "dequant"]
    assert [triton_awq.pick_method(m, []) for m in (1, 8, 9, 5000)] == ["gemv", "gemv", "fused", "dequant"]
    triton_awq.tuned_methods.cache_clear()


def test_measured_fastest_method_per_layer_shape(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from benchmarks.bench_gemm import write_tuned
    from nanovllm.quant import triton_awq
    rows = [{"k": k, "n": n, "tokens": m, "fused_us": f, "gemv_us": g, "dequant_matmul_us": d}
            for k, n, m, f, g, d in [(64, 32, 1, 5.0, 6.0, 2.0), (64, 32, 64, 8.0, None, 7.0),
                                     (32, 64, 1, 5.0, 6.0, 9.0), (32, 64, 64, 9.0, None, 9.5)]]
    monkeypatch.setattr(triton_awq, "TUNED_DIR", str(tmp_path))
    triton_awq.tuned_methods.cache_clear()
    write_tuned({"rows": rows, "gpu": "Some GPU", "date": "today"}, "test")
    assert triton_awq.tuned_methods("Some GPU", 64, 32) == [(1, "dequant"), (64, "dequant")]
    assert triton_awq.tuned_methods("Some GPU", 32, 64) == [(1, "fused"), (64, "fused")]
    assert triton_awq.tuned_methods("Some GPU", 128, 128) == [(1, "fused"), (64, "dequant")]   # summed: 10/12/11
    triton_awq.tuned_methods.cache_clear()


def test_measured_gemv_settings_are_followed(tmp_path, monkeypatch):
    """--sweep-gemv rows -> gemv_by_shape in the tuned file -> the settings awq_gemv launches with."""
    pytest.importorskip("triton")
    from benchmarks.bench_gemm import write_tuned
    from nanovllm.quant import triton_awq, triton_awq_gemv
    rows = [{"k": 256, "n": 64, "tokens": m, "fused_us": 2.0, "gemv_us": 1.0, "dequant_matmul_us": 3.0,
             "gemv_settings": settings} for m, settings in [(1, [32, 4, 2]), (4, [64, 2, 4])]]
    monkeypatch.setattr(triton_awq, "TUNED_DIR", str(tmp_path))
    monkeypatch.setattr(triton_awq_gemv, "TUNED_DIR", str(tmp_path))
    triton_awq_gemv.tuned_settings.cache_clear()
    write_tuned({"rows": rows, "gpu": "Some GPU", "date": "today"}, "test")
    assert triton_awq_gemv.tuned_settings("Some GPU", 256, 64) == [(1, [32, 4, 2]), (4, [64, 2, 4])]
    assert triton_awq_gemv.tuned_settings("Some GPU", 512, 64) == []
    triton_awq_gemv.tuned_settings.cache_clear()


def test_default_gemv_settings_fill_the_gpu():
    """Without measurements: 64 columns, 4 warps, split-K to ~4 / tokens programs per SM, whole groups."""
    pytest.importorskip("triton")
    from nanovllm.quant.triton_awq_gemv import default_settings
    cpu = torch.device("cpu")     # num_sms is 8 off the GPU
    assert default_settings(1, 6144, 4096, 128, cpu) == (64, 1, 4)            # 96 tiles already fill 8 SMs
    assert default_settings(1, 256, 4096, 128, cpu) == (64, 8, 4)             # 4 tiles x 8 = 32 programs
    assert default_settings(2, 256, 4096, 128, cpu) == (64, 4, 4)
    assert default_settings(8, 256, 4096, 128, cpu) == (64, 2, 4)
    assert default_settings(1, 256, 256, 128, cpu) == (64, 2, 4)              # at most one group per split


def test_measured_gluon_splits_are_followed(tmp_path, monkeypatch):
    """--sweep-gemv rows with the Gluon kernel's split -> gluon_gemv_by_shape -> the split it launches with."""
    pytest.importorskip("triton")
    from benchmarks.bench_gemm import write_tuned
    from nanovllm.quant import gluon_awq_gemv, triton_awq
    rows = [{"k": 4096, "n": 6144, "tokens": 1, "fused_us": 2.0, "gemv_us": 1.0, "dequant_matmul_us": 3.0,
             "gluon_split_k": 11}, {"k": 4096, "n": 6144, "tokens": 2, "fused_us": 2.0, "gemv_us": 1.0,
                                    "dequant_matmul_us": 3.0}]
    monkeypatch.setattr(triton_awq, "TUNED_DIR", str(tmp_path))
    monkeypatch.setattr(gluon_awq_gemv, "TUNED_DIR", str(tmp_path))
    gluon_awq_gemv.tuned_split.cache_clear()
    write_tuned({"rows": rows, "gpu": "Some GPU", "date": "today"}, "test")
    assert gluon_awq_gemv.tuned_split("Some GPU", 4096, 6144) == 11
    assert gluon_awq_gemv.tuned_split("Some GPU", 4096, 4096) is None
    gluon_awq_gemv.tuned_split.cache_clear()


def test_a_later_measurement_replaces_the_earlier_row(tmp_path):
    """bench_gemm --from A B: rows of B replace A's rows of the same layer and token count."""
    pytest.importorskip("triton")
    from benchmarks.bench_gemm import merge_saved
    old = {"command": "a", "rows": [{"k": 1, "n": 2, "tokens": t, "gemv_us": 5.0} for t in (1, 2)]}
    new = {"command": "b", "rows": [{"k": 1, "n": 2, "tokens": 1, "gemv_us": 3.0}]}
    for name, record in (("a.json", old), ("b.json", new)):
        with open(tmp_path / name, "w") as f:
            json.dump(record, f)
    merged = merge_saved([str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert sorted((row["tokens"], row["gemv_us"]) for row in merged["rows"]) == [(1, 3.0), (2, 5.0)]
    assert merged["command"] == "a + b"


def test_settings_are_all_compiled_before_any_is_timed_and_keep_their_best_round():
    pytest.importorskip("triton")
    from benchmarks.bench_gemm import time_settings
    events, readings = [], iter([9.0, 5.0, 4.0, 6.0])        # round 1: a, b; round 2: a, b

    def call(name):
        return lambda *layer: events.append(("compile", name))

    def timer(layers, fn):
        events.append(("time", fn.__name__))
        return next(readings)

    a, b = call("a"), call("b")
    a.__name__, b.__name__ = "a", "b"
    assert time_settings([("layer", None)], {"a": a, "b": b}, timer=timer) == {"a": 4.0, "b": 5.0}
    assert events == [("compile", "a"), ("compile", "b"), ("time", "a"), ("time", "b"), ("time", "a"), ("time", "b")]
