"""The Rich renderables of the dashboard as plain strings: heat map, rank, room and event lines, help table."""

from __future__ import annotations

import io

import msgspec
import pytest
from rich.console import Console
from rich.style import Style
from rich.text import Text
from tui_support import FIXED_NOW, build_model

from kvtop.model.cluster import STUCK_AFTER_S, ClusterModel
from kvtop.model.shapes import Liveness
from kvtop.tui.app import KvtopApp
from kvtop.tui.details import rank_history
from kvtop.tui.frame import TREND_CELLS, FrameBuilder, Options, RankRow, Trend
from kvtop.tui.renderables.heatmap import LinkHeatMap
from kvtop.tui.rows import (
    RANK_COLUMNS,
    RANK_HEADER,
    ROOM_HEADER,
    Palette,
    TrendPeaks,
    event_line,
    rank_columns,
    rank_line,
    room_line,
)
from kvtop.tui.screens.help import binding_table
from kvtop.tui.themes import load_themes
from kvtop.tui.views.failures import FailuresView, detail, group_label
from kvtop.tui.widgets.row_list import RowList
from kvtop.views.event_lines import to_line
from transport.kvpoll import KVPoll
from transport.plane.events import EVENT_SCHEMA, EventBatch, Failure, Heartbeat, LogFollowed, TransferDone

HOT, FAILED = Style(color="#00ffff"), Style(color="#ff0000", bold=True)


@pytest.fixture(scope="module")
def palette() -> Palette:
    return Palette.from_theme(load_themes().themes["kvtop-dark"])


def render(renderable: object, width: int = 80) -> str:
    console = Console(width=width, record=True, color_system=None, file=io.StringIO())
    console.print(renderable)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines())


def styles_of(text: Text, needle: str) -> list[Style | str]:
    """The styles of the spans that cover the first `needle` in `text` (the text's own style first)."""
    start = text.plain.index(needle)
    return [text.style, *(span.style for span in text.spans if span.start <= start and start + len(needle) <= span.end)]


LINKS = {("prefill-0", "decode-0"): (2.0, 0), ("prefill-0", "decode-1"): (0.5, 3), ("prefill-1", "decode-0"): (0.0, 0)}


def test_the_heat_map_draws_one_row_per_prefill_and_a_column_per_decode():
    """Shade by share of the busiest link, the rate, failed rooms marked ✗, a dash where no link exists."""
    assert render(LinkHeatMap(LINKS, HOT, FAILED)) == "\n".join(
        [
            "               decode-0         decode-1",
            " prefill-0  █ 2.00 GB/s  ░ 500.0 MB/s ✗3",
            " prefill-1        0 B/s                -",
        ]
    )


def test_a_heat_map_narrower_than_its_cells_names_its_unit_once():
    """Where the cells' own units would not fit (the panel beside the grid at 120 columns cut `decode-1` and the
    rates), every cell is in the busiest link's unit, named in the corner; a rate that rounds to none says `<`."""
    links = {**LINKS, ("prefill-1", "decode-1"): (0.004, 1)}
    wide = render(LinkHeatMap(links, HOT, FAILED, width=80))
    narrow = render(LinkHeatMap(links, HOT, FAILED, width=36))

    assert "500.0 MB/s" in wide and "GB/s" not in wide.splitlines()[0]
    assert narrow == "\n".join(
        [
            " GB/s       decode-0    decode-1",
            " prefill-0    █ 2.00   ░ 0.50 ✗3",
            " prefill-1      0.00    <0.01 ✗1",
        ]
    )
    assert max(len(line) for line in narrow.splitlines()) <= 36


def test_the_heat_map_colours_hot_links_and_failed_rooms_from_its_styles():
    """Links at half the peak or more take the hot style; failed-room counts the failed style."""
    console = Console(width=80, color_system="truecolor", file=io.StringIO())
    segments = list(console.render(LinkHeatMap(LINKS, HOT, FAILED)))

    def style(needle: str) -> Style | None:
        return next(segment.style for segment in segments if needle in segment.text)

    assert (style("2.00 GB/s"), style("✗3")) == (HOT, FAILED)
    assert style("500.0 MB/s") != HOT


def test_the_heat_map_without_links_says_so():
    """No transfer yet: one dim line instead of an empty table."""
    assert render(LinkHeatMap({}, HOT, FAILED)) == "no transfers yet"


def test_a_rank_line_fills_the_columns_of_its_header(palette: Palette):
    """Label, role, liveness, rate and its trend, rooms in flight, origins, echoes, failures' trend, CPU and
    rejected frames line up under RANK_HEADER; the trends are drawn to the scale of every rank's."""
    trend = Trend(gbps=(0.0,) * 10 + (0.75, 1.5), origins=(0,) * 10 + (1, 0), echoes=(0,) * 10 + (0, 2))
    row = RankRow("decode-0/TP1", "decode", "decode-0", 1, Liveness.GONE, 1.5, 3, 2, 7, 12.4, 5, trend)

    line = rank_line(row, palette, peaks=TrendPeaks.of([row]))

    assert RANK_HEADER == (
        "RANK              ROLE    SOURCE  STATE          RATE  RATE 5m       IN FLIGHT  ORIGINS  ECHOES  FAILED 5m"
        "     CPU %  REJECTED"
    )
    assert line.plain == (
        "decode-0/TP1      decode  agent   gone      1.50 GB/s  ··········▄█          3        2       7  ··········▄█"
        "     12         5"
    )
    assert len(line.plain) == len(RANK_HEADER)
    assert palette.error in styles_of(line, "gone")
    assert palette.error in styles_of(line, "       2")
    assert palette.dim in styles_of(line, "      7")
    assert palette.warning in styles_of(line, "         5")
    failed_trend = line.plain.rindex("▄█")
    assert palette.error in [s.style for s in line.spans if s.start == failed_trend], "a share with an origin"
    assert palette.warning in [s.style for s in line.spans if s.start == failed_trend + 1], "echoes only"


def test_an_sglang_rank_with_a_long_instance_name_keeps_the_grid_aligned(palette: Palette):
    """An SGLang rank (named by host and port) says `sglang` in SOURCE; a label past the RANK column keeps its start
    and its end around `…`, and every column stays under its header."""
    row = RankRow("decode-gpu-node-17-30000/TP3", "decode", "decode-gpu-node-17-30000", 3, Liveness.ALIVE, 0.5, 1, 0,
                  0, 3.0, 0, Trend((0.0,) * TREND_CELLS, (0,) * TREND_CELLS, (0,) * TREND_CELLS), "sglang")  # fmt: skip
    line = rank_line(row, palette)
    assert line.plain.startswith("decode-g…0000/TP3 decode  sglang  alive")
    assert len(line.plain) == len(RANK_HEADER)
    assert palette.accent in styles_of(line, "sglang")


def test_a_prefill_instance_known_only_from_its_peers_lines_shows_dashes_for_its_own_counts(palette: Palette):
    """Named by decode lines alone (no log of its own), its rooms in flight, origins, echoes and failures over
    time are unknown (a log rank's rate, CPU and their trends too)."""
    empty = Trend((0.0,) * TREND_CELLS, (0,) * TREND_CELLS, (0,) * TREND_CELLS)
    row = RankRow("10.0.0.6:8999", "prefill", "10.0.0.6:8999", 0, Liveness.LOG, 0.0, 0, 0, 0, 0.0, 0, empty, "log",
                  named_by_peers=True)  # fmt: skip

    line = rank_line(row, palette).plain

    cells = ["10.0.0.6:8999", "prefill", "log", "log", "-", "-" * TREND_CELLS, "-", "-", "-", "-" * TREND_CELLS, "-"]
    assert line.split() == [*cells, "0"]
    assert len(line) == len(RANK_HEADER)


def test_the_source_column_shows_only_beside_ranks_that_are_not_agents_and_outlasts_echoes():
    """All kvtop agents: no SOURCE column (it would say `agent` on every row); with an SGLang or log rank it is
    there, and where the grid is narrow it leaves after REJECTED, CPU % and ECHOES (the failures' trend still
    shows echoes), before ROLE."""
    assert "SOURCE" not in rank_columns(0, sources=False)
    assert "SOURCE" in rank_columns(0, sources=True)
    full = sum(RANK_COLUMNS.values())
    without_three = full - RANK_COLUMNS["REJECTED"] - RANK_COLUMNS["CPU %"] - RANK_COLUMNS["ECHOES"]
    narrower = rank_columns(without_three, sources=True)
    assert "SOURCE" in narrower and not {"REJECTED", "CPU %", "ECHOES"} & narrower
    assert "SOURCE" not in rank_columns(without_three - 1, sources=True)
    assert "ROLE" in rank_columns(without_three - 1, sources=True)


def test_a_rank_whose_registration_is_refused_reads_unlisted_while_heard_and_its_liveness_once_gone(palette: Palette):
    """Alive (suspected too: no peer resolving it is why rooms fail on it), its STATE says `unlisted` in the error
    colour, aligned under the header; gone, its last heartbeat's word no longer matters: `gone`."""
    why = "registration of prefill-0/TP0 refused: 10.0.0.3 holds it live"
    empty = Trend((0.0,) * TREND_CELLS, (0,) * TREND_CELLS, (0,) * TREND_CELLS)
    alive = RankRow("prefill-0/TP0", "prefill", "prefill-0", 0, Liveness.ALIVE, 0.0, 0, 0, 0, 0.0, trend=empty,
                    suspected=True, unlisted=why)  # fmt: skip
    gone = RankRow("prefill-0/TP0", "prefill", "prefill-0", 0, Liveness.GONE, 0.0, 0, 0, 0, 0.0, unlisted=why)

    line = rank_line(alive, palette)

    assert line.plain.split()[3] == "unlisted" and len(line.plain) == len(RANK_HEADER)
    assert palette.error in styles_of(line, "unlisted")
    assert rank_line(gone, palette).plain.split()[3] == "gone"


def test_a_rank_line_colours_liveness(palette: Palette):
    """Alive is the success colour, stale the warning colour; no origins, no error colour."""
    alive = RankRow("prefill-0/TP0", "prefill", "prefill-0", 0, Liveness.ALIVE, 0.0, 0, 0, 0, 0.0)
    stale = RankRow("prefill-0/TP0", "prefill", "prefill-0", 0, Liveness.STALE, 0.0, 0, 0, 0, 0.0)

    assert palette.success in styles_of(rank_line(alive, palette), "alive")
    assert palette.warning in styles_of(rank_line(stale, palette), "stale")
    assert palette.error not in [span.style for span in rank_line(alive, palette).spans]


def test_a_sidecar_ranks_silent_log_shows_idle_as_a_warning_and_a_dead_server_down_as_an_error(palette: Palette):
    """A sidecar that beats beside a silent log says so in the rank grid: idle (warning), down (error)."""
    idle = RankRow("decode-0/TP0", "decode", "decode-0", 0, Liveness.IDLE, 0.0, 0, 0, 0, 0.0)
    down = RankRow("decode-0/TP0", "decode", "decode-0", 0, Liveness.DOWN, 0.0, 0, 0, 0, 0.0)

    assert palette.warning in styles_of(rank_line(idle, palette), "idle")
    assert palette.error in styles_of(rank_line(down, palette), "down")


def test_a_sidecar_ranks_history_names_the_log_it_follows(palette: Palette):
    """The rank panel of a sidecar's rank: its file, read position, garbled lines and silence."""
    model = ClusterModel()
    log = LogFollowed("/var/log/sglang/decode.log", True, 512, 1024, 9, 2, 1, 40.0, True)
    beat = Heartbeat(FIXED_NOW, {}, 0, 0, 0.0, 0, 0.0, log=log)
    model.apply("decode-0/TP0", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 0, 1, 1, FIXED_NOW, [beat]), FIXED_NOW)

    text = rank_history(model, "decode-0/TP0", FIXED_NOW, palette).plain

    assert "idle, last heard 0 s ago" in text
    assert "log decode-0: /var/log/sglang/decode.log at 512/1024 B, 9 lines, 2 garbled, 1 rotations, silent 40s" in text


@pytest.fixture(scope="module")
def frame():
    """A frame of the fixture cluster: retired, failed, open and stuck rooms."""
    return FrameBuilder(build_model()).build(Options(), FIXED_NOW)


def test_a_room_line_shows_age_idle_progress_size_link_and_every_rank_state(frame, palette: Palette):
    """A room that succeeded: 100 %, 1.0 MB, its link with OK for its four ranks beside their instance, ranks alike
    said once (`prefill-0/TP0=OK prefill-0/TP1=OK` named the instance twice), in the success colour."""
    room = next(room for room in frame.rooms if frame.outcome(room) is True)

    line = room_line(room, frame, palette)

    prefill, decode = room.link
    assert sorted(room.states) == [f"{decode}/TP0", f"{decode}/TP1", f"{prefill}/TP0", f"{prefill}/TP1"]
    link = f"{prefill} TP0,TP1=OK -> {decode} TP0,TP1=OK"
    age, idle = FIXED_NOW - room.first_seen, FIXED_NOW - room.last_progress
    assert line.plain == f"{room.room:<21}{age:>7.1f}{idle:>8.1f}      100%     1.0 MB  {'':<8}{link}"
    assert ROOM_HEADER.index("LINK") == line.plain.index(prefill)
    assert len(line.plain) <= 120 - 2  # whole at 120 columns, beside the list's scrollbar
    assert palette.success in styles_of(line, "OK")


def test_a_failed_room_line_shows_fail_in_the_error_colour(frame, palette: Palette):
    """The room is flagged FAILED and each rank that failed it reads FAIL, in the error colour."""
    room = next(room for room in frame.rooms if frame.outcome(room) is False)

    line = room_line(room, frame, palette)

    failed = sorted(label for label, state in room.states.items() if state == KVPoll.Failed)
    shown = {
        f"{instance}/{rank}": state
        for side in line.plain[ROOM_HEADER.index("LINK") :].split(" -> ")
        for instance, *groups in [side.split()]
        for names, state in (group.split("=") for group in groups)
        for rank in names.split(",")
    }
    assert failed and [label for label, state in sorted(shown.items()) if state == "FAIL"] == failed
    assert palette.error in styles_of(line, "FAIL")
    assert line.plain[ROOM_HEADER.index("FLAG") :].startswith("FAILED  ")
    assert "STUCK" not in line.plain


def test_a_stuck_room_line_is_flagged_stuck_before_its_states(frame, palette: Palette):
    """An open room without progress for longer than STUCK_AFTER_S is flagged STUCK (in the FLAG column, so a
    narrow terminal still shows it) in the warning colour."""
    room = next(room for room in frame.rooms if frame.stuck(room))

    line = room_line(room, frame, palette)

    assert FIXED_NOW - room.last_progress > STUCK_AFTER_S
    assert line.plain[ROOM_HEADER.index("FLAG") :].startswith("STUCK   ")
    assert "33%" in line.plain
    assert any(isinstance(style, Style) and style.color == palette.warning.color for style in styles_of(line, "STUCK"))


def test_an_open_room_that_moves_is_not_stuck(frame, palette: Palette):
    """Open with recent progress: no flag."""
    room = next(room for room in frame.rooms if frame.outcome(room) is None and not frame.stuck(room))

    assert "STUCK" not in room_line(room, frame, palette).plain


def test_event_lines_take_their_level_colour(palette: Palette):
    """Each line takes the colour of the level it shows at (error, debug dim, info plain), named in its text."""
    origin = Failure(
        FIXED_NOW, 7, "decode-0/TP1", "KV chunk 3 failed its checksum", "checksum", "error", False, "decode-0/TP1"
    )
    echo = Failure(FIXED_NOW, 7, "decode-0/TP0", "from another rank", "another_rank", "debug", True, "decode-0/TP1")
    done = TransferDone(FIXED_NOW, 8, 1 << 20, 0.01, "prefill-0")

    shown = [(origin, "error"), (echo, "debug"), (done, "info")]
    lines = [event_line("decode-0/TP1", event, level, palette) for event, level in shown]

    assert [line.plain for line in lines] == [to_line("decode-0/TP1", event, level) for event, level in shown]
    assert [line.style for line in lines] == [palette.error, palette.dim, ""]
    assert lines[0].plain.startswith("2026-05-28 20:26:50.000 decode-0/TP1     ERROR   failure   room=7 checksum:")


KEYS_SHOWN = {"question_mark": "?", "slash": "/", "comma": ",", "full_stop": ".", "less_than_sign": "<",
              "greater_than_sign": ">", "left_square_bracket": "[", "right_square_bracket": "]"}  # fmt: skip


def test_the_help_table_lists_every_binding_with_its_key():
    """Each app, list and failures-view binding is one row: its key as displayed, then its description (the
    longer tooltip where one is given)."""
    sections = {"Everywhere": KvtopApp.BINDINGS, "Lists": RowList.BINDINGS, "Failures": FailuresView.BINDINGS}

    table = render(binding_table(sections), width=100).splitlines()

    for section, bindings in sections.items():
        assert section in [line.strip() for line in table]
        for binding in bindings:
            key = " / ".join(KEYS_SHOWN.get(key, key) for key in binding.key.split(","))
            described = (binding.tooltip or binding.description).split()
            assert any(line.split() == [*key.split(), *described] for line in table), binding


def test_the_failure_detail_lists_every_field_of_the_origin_apart_from_its_value(palette: Palette):
    """`d` in the failures view: one line per recorded field, name then value, with space between them."""
    group = next(group for group in build_model().groups() if group.origin is not None)

    shown = detail(group, palette).plain.split("Raw origin event\n")[1].splitlines()

    fields = msgspec.structs.asdict(group.origin)
    assert [line.split(maxsplit=1)[0] for line in shown if line.strip()] == list(fields)
    assert [line.split(maxsplit=1)[1] for line in shown if line.strip()] == [str(v) or "-" for v in fields.values()]


def test_a_failure_groups_row_says_1_echo_and_keeps_its_columns(palette: Palette):
    """The failures tree read `1 echoes` under every lost prefill's rooms; one echo is `1 echo`, and the time after
    it stays in the column of the rows with more."""
    model = ClusterModel()
    for seq, (room, echoing) in enumerate(((7, ["decode-0/TP0"]), (8, ["decode-0/TP0", "prefill-0/TP0"])), 1):
        events = [Failure(FIXED_NOW, room, "decode-0/TP1", "lost it", "peer_lost", "error", False, "decode-0/TP1")]
        model.apply("decode-0/TP1", EventBatch(EVENT_SCHEMA, "decode", "decode-0", 1, 1, seq, FIXED_NOW, events), 0.0)
        for label in echoing:
            instance, _, rank = label.rpartition("/TP")
            echo = Failure(FIXED_NOW, room, label, "from another rank", "propagated", "debug", True, "decode-0/TP1")
            batch = EventBatch(EVENT_SCHEMA, instance.split("-")[0], instance, int(rank), 1, seq, FIXED_NOW, [echo])
            model.apply(label, batch, 0.0)

    rows = {group.room: group_label(group, palette).plain for group in model.groups()}

    assert "  1 echo " in rows[7] and "echoes" not in rows[7]
    assert "  2 echoes  " in rows[8]
    assert rows[7].index(":") == rows[8].index(":")
