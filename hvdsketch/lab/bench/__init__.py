"""Benchmarks behind ``hvdsketch bench <name>``; each module exposes ``add_arguments`` and ``run``."""
