"""The link-bound mode's arithmetic: the rate from dense's unshaped time, and each entry's floor and model."""
from hvdsketch.lab.bench.exchange import TCP_SHARE
from hvdsketch.lab.bench.linkbound import checked, chosen_rate


def test_the_rate_makes_dense_take_factor_times_its_unshaped_time_over_the_link():
    dense = {"exchange_s": 0.5, "max_bytes_sent_per_step": 20e6}
    rate = chosen_rate(dense, 5.0)
    assert 20e6 * 8 / (rate * 1e6 * TCP_SHARE) >= 5 * 0.5  # rounded down: at least the factor
    assert 20e6 * 8 / ((rate + 1) * 1e6 * TCP_SHARE) < 5 * 0.5


def test_each_entry_is_held_against_its_floor_and_the_model_codec_plus_the_longer_of_floor_and_collective_cpu():
    row = {"label": "allgather", "exchange_s": 0.2, "exchange_range_s": [0.19, 0.22], "floor_s": 0.1,
           "vs_floor": 2.0, "mean_bytes_sent_per_step": 1e6, "max_bytes_sent_per_step": 1.1e6, "link_bytes_per_step": 1.2e6,
           "collectives_per_step": 2.0, "codec_s": 0.03}
    auto = {**row, "label": "auto"}
    slow = {**row, "label": "balanced", "floor_s": 0.01}
    shaped = {"rows": [row, auto, slow]}
    unshaped = {"rows": [{"label": "allgather", "exchange_s": 0.05, "codec_s": 0.02},
                         {"label": "balanced", "exchange_s": 0.08, "codec_s": 0.02}]}
    (gather, chosen, cpu_bound) = checked(shaped, unshaped)
    assert abs(gather["model_s"] - (0.03 + 0.1)) < 1e-12  # the link's floor is longer than the collectives' CPU
    assert abs(gather["model_error"] - (0.13 / 0.2 - 1)) < 1e-12 and gather["unshaped_s"] == 0.05
    assert abs(cpu_bound["model_s"] - (0.03 + 0.06)) < 1e-12  # the collectives' CPU is longer than the floor
    assert chosen["model_s"] is None and chosen["unshaped_s"] is None  # auto runs shaped only
