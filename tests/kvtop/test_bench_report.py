"""`kvtop.bench.report`: a result printed from its data, with units, baselines, ratios and target verdicts."""

from kvtop.bench.ingest import IngestResult
from kvtop.bench.report import Compare, Report, at_most, text, unit


def test_units_come_from_the_names() -> None:
    """Units follow the field names, dotted names included; ratios have none."""
    assert [unit(n) for n in ("kvtop_gbps", "runs_gbps.raw", "check_wall_s", "lines_per_s", "rss_mb", "ratio")] == [
        "GB/s", "GB/s", "s", "/s", "MiB", "",
    ]  # fmt: skip


def test_a_result_reads_its_setting_comparisons_and_targets_first() -> None:
    """The setting, then measured vs baseline with the ratio and the verdicts, then the rest; None left out."""
    result = IngestResult(400_000.0, 2_000_000.0, 0.2, 0.5, [0, 1], 12, 1000, 2)
    assert text(result.as_dict(), result.REPORT).splitlines() == [
        "events: 1,000",
        "repeats: 2",
        "events_per_s: 400,000/s (target >= 300,000/s: met) vs decode_only_per_s 2,000,000/s: "
        "ratio 0.2 (target >= 0.5: MISSED)",
        "check_wall_s: 0.5 s (target <= 1 s: met)",
        "check_exit_codes: 0, 1",
        "check_load_rooms: 12",
    ]


def test_legs_named_as_a_table_print_side_by_side() -> None:
    """Records named in `table` print as one table, a row per field with its unit; fractions as percentages."""
    data = {"a": {"sync_s": 1.5, "gaps": 0}, "b": {"sync_s": 12.25, "gaps": 3}, "cost": 0.0123}
    report = Report(
        compare=(Compare("b.sync_s", "a.sync_s", "cost"),), targets=(at_most("b.gaps", 0),), table=("a", "b")
    )
    assert text(data, report).splitlines() == [
        "b.sync_s: 12.2 s vs a.sync_s 1.5 s: cost 1.23%",
        "b.gaps: 3 (target <= 0: MISSED)",
        "         a    b",
        "sync_s 1.5 12.2 s",
        "gaps     0    3",
    ]
