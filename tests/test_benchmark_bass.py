"""benchmarks/bass.py runs end to end (at a tiny scale) and writes the JSON schema of issue 7."""

import json
import math

from tests.benchmark_module import load_benchmark


def test_quick_benchmark_writes_final_regret_and_f1_per_setting(tmp_path, monkeypatch):
    bench = load_benchmark("bass")
    monkeypatch.setitem(bench.QUICK, "horizon", 100)  # smaller still than --quick: a test is not a smoke run
    monkeypatch.setattr(bench, "ALPHAS", (0.25,))
    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "bass.json").read_text())
    methods = {"bass", "independent", "pooled", "oracle", "club", "sclub", "dynucb"}
    assert set(results["final_regret"]) == {"N2_C2", "N2_none", "N6_C2", "N6_none"}
    for by_method in results["final_regret"].values():
        assert methods <= set(by_method) and all(math.isfinite(v) and v >= 0 for v in by_method.values())
    for setting, by_method in results["final_regret"].items():  # same shape, and each median inside its IQR
        assert set(results["final_regret_median"][setting]) == set(by_method)
        for m, median in results["final_regret_median"][setting].items():
            q25, q75 = results["final_regret_iqr"][setting][m]
            assert q25 <= median <= q75
    assert set(results["f1_final"]) == {"N2_C2", "N6_C2"}
    assert all(0 <= f1 <= 1 for f1 in results["f1_final"].values())
    assert results["mb_shared"]["N6_C2"]["independent"] == 0 < results["mb_shared"]["N6_C2"]["pooled"]
    assert (tmp_path / "bass_regret.png").stat().st_size > 0
