"""The decode tuner's choice of launch settings per launch size (benchmarks/bench_decode_steps.py), on
made-up timings: what it writes into the tuned file that decode_attention reads."""
from benchmarks.bench_decode_steps import choose_tiers, programs_per_sm, tuned_tiers, write_tuned
from nanovllm.attention.triton_decode import pick_settings


def step(size: float, times: dict[str, float], name: int | str = 1) -> dict:
    return {"step": name, "programs_per_sm": size, "engine_splits": 1, "engine_settings": "a",
            "us": {settings: {1: t} for settings, t in times.items()}}


def test_each_launch_size_gets_its_fastest_setting_and_ties_keep_the_one_below():
    steps = [step(2.0, {"a": 50, "b": 60}), step(4.0, {"a": 80, "b": 79}),     # b 1% faster: a tie, keep a
             step(8.0, {"a": 100, "b": 90}), step(8.0, {"a": 100, "b": 92}), step(16.0, {"a": 200, "b": 150})]
    assert tuned_tiers(steps, "a") == [(0.0, "a"), (8.0, "b")]
    assert tuned_tiers(steps[:2], "b") == [(0.0, "a")]        # the current setting loses by 17% at size 2


def test_a_long_context_batch_decides_a_size_that_bench_steps_leave_tied():
    steps = [step(3.0, {"a": 50, "b": 51}), step(3.0, {"a": 300, "b": 260}, "64x8192")]
    assert tuned_tiers(steps[:1], "a") == [(0.0, "a")]
    assert tuned_tiers(steps, "a") == [(0.0, "b")]
    record = {"steps": steps}
    assert choose_tiers(record, 32, ["a"])["tiers_replace_tuned"]          # 14% of bench + long together
    assert choose_tiers(record, 32, ["a"])["tiers_s"] == round(32 * 28 / 1e6 * 51, 4)   # bench steps only


def test_thresholds_admit_the_launch_they_were_measured_on():
    size = programs_per_sm(128, 1, 132)                     # 8 KV heads: 1,024 programs, 7.7576 per SM
    assert size == 7.75
    table = {"settings": {"int8": {"block_n": 128}}, "many_programs": {"int8": [{"min_programs_per_sm": size,
                                                                                  "block_n": 64}]}}
    assert pick_settings(table, "int8", 128 * 8 / 132) == {"block_n": 64}
    assert pick_settings(table, "int8", 112 * 8 / 132) == {"block_n": 128}


def test_tiers_of_another_head_dim_go_under_its_own_key(tmp_path, monkeypatch):
    """A head_dim-64 sweep (--model Llama-3.2-1B) adds its entry beside the head_dim-128 settings, which stay."""
    import json

    from nanovllm.attention import triton_decode
    monkeypatch.setattr(triton_decode, "TUNED_DIR", str(tmp_path))
    triton_decode.tuned_table.cache_clear()
    record = {"kv_cache_dtype": "int8", "tiers_replace_tuned": True, "tiers": [(0.0, "128/4/2"), (6.0, "64/2/3")]}
    write_tuned([record], "cmd", "Some GPU")
    triton_decode.tuned_table.cache_clear()
    write_tuned([{**record, "tiers": [(0.0, "256/4/2")]}], "cmd", "Some GPU", head_dim=64)
    with open(triton_decode.tuned_settings_path("Some GPU")) as f:
        table = json.load(f)
    triton_decode.tuned_table.cache_clear()
    assert table["settings"]["int8"] == {"block_n": 128, "num_warps": 4, "num_stages": 2}
    assert table["many_programs"]["int8"] == [{"min_programs_per_sm": 6.0, "block_n": 64, "num_warps": 2,
                                               "num_stages": 3}]
    assert table["by_head_dim"] == {"64": {"settings": {"int8": {"block_n": 256, "num_warps": 4, "num_stages": 2}},
                                           "many_programs": {}}}
    assert pick_settings(table, "int8", 8, 64) == {"block_n": 256, "num_warps": 4, "num_stages": 2}
    assert pick_settings(table, "int8", 8, 128)["block_n"] == 64
