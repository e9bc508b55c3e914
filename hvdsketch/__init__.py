"""hvdsketch."""
