"""The link-bound mode's arithmetic: the rate from dense's unshaped time, and each entry's floor and model."""
from hvdsketch.lab.bench.exchange import TCP_SHARE
from hvdsketch.lab.bench.linkbound import checked, chosen_rate


def test_the_rate_makes_dense_take_factor_times_its_unshaped_time_over_the_link():
    dense = {"exchange_s": 0.5, "max_bytes_sent_per_step": 20e6}
    rate = chosen_rate(dense, 5.0)
    assert 20e6 * 8 / (rate * 1e6 * TCP_SHARE) >= 5 * 0.5  # rounded down: at least the factor
    assert 20e6 * 8 / ((rate + 1) * 1e6 * TCP_SHARE) < 5 * 0.5


def test_each_entry_is_held_against_its_floor_and_the_model_floor_plus_its_unshaped_time():
    row = {"label": "allgather", "exchange_s": 0.2, "exchange_range_s": [0.19, 0.22], "floor_s": 0.1,
           "vs_floor": 2.0, "mean_bytes_sent_per_step": 1e6, "max_bytes_sent_per_step": 1.1e6, "link_bytes_per_step": 1.2e6,
           "collectives_per_step": 2.0}
    auto = {**row, "label": "auto"}
    shaped = {"rows": [row, auto]}
    unshaped = {"rows": [{"label": "allgather", "exchange_s": 0.05}]}
    (gather, chosen) = checked(shaped, unshaped)
    assert gather["model_s"] == 0.1 + 0.05 and abs(gather["model_error"] - (0.15 / 0.2 - 1)) < 1e-12
    assert chosen["model_s"] is None and chosen["unshaped_s"] is None  # auto runs shaped only
