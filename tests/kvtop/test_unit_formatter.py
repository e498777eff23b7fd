"""The one formatter of byte counts and rates, shared by the CLI views and the dashboard."""

from __future__ import annotations

import pytest

from kvtop.views.units import gbps, progress, rate, size


@pytest.mark.parametrize(
    ("nbytes", "shown"),
    [(0, "0 B"), (900, "900 B"), (253952, "254 KB"), (1 << 20, "1.0 MB"), (45.6e6, "45.6 MB"), (1.234e9, "1.23 GB")],
)
def test_size_picks_the_decimal_unit_that_keeps_three_digits(nbytes: float, shown: str):
    """B below 1 KB, KB below 1 MB, MB below 1 GB, GB above."""
    assert size(nbytes) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0.0, "0 B/s"),
        (0.0004, "400 KB/s"),
        (0.0123, "12.3 MB/s"),
        (0.5, "500.0 MB/s"),
        (1.0, "1.00 GB/s"),
        (12.345, "12.35 GB/s"),
        (123.4, "123.40 GB/s"),
    ],
)
def test_a_rate_in_gbps_is_shown_in_the_unit_that_keeps_three_digits(value: float, shown: str):
    """The model's GB/s as B/s, KB/s, MB/s or GB/s."""
    assert gbps(value) == shown


@pytest.mark.parametrize(("per_s", "shown"), [(0.99996e9, "1.00 GB/s"), (999_950, "1.0 MB/s"), (999.6, "1 KB/s")])
def test_a_figure_that_rounds_to_1000_moves_to_the_bigger_unit(per_s: float, shown: str):
    """A rate that rounds to 1000 of a unit is shown as 1 of the next one, keeping three digits."""
    assert rate(per_s) == shown


@pytest.mark.parametrize(
    ("done", "total", "shown"),
    [
        (1_089_536, 1_089_536, "1.1 MB/1.1 MB"),
        (524_288, 1_089_536, "524 KB/1.1 MB"),
        (1_089_000, 1_089_536, "1.1 MB/1.1 MB (1,089,000/1,089,536 B)"),
    ],
)
def test_progress_reads_in_units_and_exact_only_where_rounding_hides_a_shortfall(done: int, total: int, shown: str):
    """A room's bytes moved of its total, as the size column says them; a few bytes short reads whole when rounded,
    so then the exact counts follow."""
    assert progress(done, total) == shown
