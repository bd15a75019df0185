"""The charts render from the committed benchmark records (when matplotlib is installed)."""
import pytest

pytest.importorskip("matplotlib")


def test_charts_render_from_the_records(tmp_path):
    import shutil

    from nanovllm.tools.charts import copy_rates, render_charts
    from nanovllm.utils.results import latest_bench
    root = tmp_path / "benchmark_results"
    shutil.copytree("benchmark_results", root, ignore=shutil.ignore_patterns("*.png"))
    paths = render_charts(str(root))
    assert len(paths) == 3 and all((tmp_path / p).stat().st_size > 10_000 for p in paths)
    table = latest_bench(str(root))
    assert any(("random", "auto") in records for records in table.values())
    assert all(1e12 < rate < 1e13 for rate in copy_rates(str(root)).values())
