"""The recording format: what it reads back exactly, and what it does with damage (torn writes, bad
checksums, a damaged segment, another schema version)."""

from __future__ import annotations

import json
import os
import stat
import struct
from pathlib import Path

import msgspec
import pytest

from kvtop.model.cluster import ClusterModel
from kvtop.model.intake import Refused
from kvtop.model.shapes import GONE_S, Liveness
from kvtop.record import keyframes
from kvtop.record.format import (
    BLOCK_HEADER,
    FILE_HEADER,
    BlockKind,
    NothingRecorded,
    RecordingError,
    UnknownSchema,
    checksum,
)
from kvtop.record.reader import Recording, missing_segments
from kvtop.record.records import OPS_DECODER, Accounted, apply_op
from kvtop.record.replay import Replay
from kvtop.record.synthetic import feed
from kvtop.record.writer import Recorder
from kvtop.sources.synthetic import SyntheticCluster
from kvtop.views.failures import to_json
from kvtop.views.tables import status_json

CLUSTER = SyntheticCluster(prefill=2, decode=2, tp=2, spacing_s=0.001, failure_rate=0.1)


def _record(folder: Path, passes: int = 60, **options: object) -> list[tuple[float, str]]:
    """A recording of `passes` collector passes; returns (time, status JSON) as the live model said at each."""
    options = {"keyframe_events": 3000, "segment_bytes": 40_000, "flush_s": 3600.0, **options}
    recorder = Recorder(folder, **options)  # type: ignore[arg-type]
    model = ClusterModel()
    said: list[tuple[float, str]] = []

    def note(now: float) -> None:
        said.append((now, json.dumps([status_json(model, now, 60.0), to_json(model.groups(), None)])))

    feed(recorder, model, CLUSTER, passes, rooms_per_pass=20, on_pass=note)
    recorder.close()
    return said


def _replayed(replay: Replay, now: float) -> str:
    model = replay.at(now).model
    return json.dumps([status_json(model, now, 60.0), to_json(model.groups(), None)])


def test_replay_at_any_time_rebuilds_the_model_the_live_side_held(tmp_path: Path) -> None:
    """At every pass, the replayed model's status (its incidents included) and failures equal what the live model
    said then."""
    said = _record(tmp_path / "rec")
    replay = Replay(tmp_path / "rec")
    assert len(replay.recording.segments) > 2, "the test wants keyframes in several segments"
    assert not replay.recording.damage
    for now, live in said[::7] + said[-1:]:
        assert _replayed(replay, now) == live


def test_stepping_forward_gives_the_same_models_as_seeking(tmp_path: Path) -> None:
    """A cursor advanced pass by pass holds, at each pass, the model a fresh seek there builds."""
    said = _record(tmp_path / "rec", passes=30)
    replay = Replay(tmp_path / "rec")
    cursor = replay.at(said[0][0])
    for now, live in said[1:]:
        heard = cursor.advance(now)
        assert heard, "each pass delivered batches"
        model = cursor.model
        assert json.dumps([status_json(model, now, 60.0), to_json(model.groups(), None)]) == live


def test_files_and_folders_are_private_to_the_owner_and_group(tmp_path: Path) -> None:
    """Segments and indexes are 0640, the folder 0750, whatever the umask."""
    old = os.umask(0)
    try:
        _record(tmp_path / "rec", passes=5)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "rec").stat().st_mode) == 0o750
    files = list((tmp_path / "rec").iterdir())
    assert files and {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o640}


def test_a_torn_last_block_reads_up_to_it_and_says_how_much_was_lost(tmp_path: Path) -> None:
    """Cut mid-block (kill -9): every whole block before the cut replays; the torn bytes are counted."""
    said = _record(tmp_path / "rec")
    last = sorted((tmp_path / "rec").glob("*.kvr"))[-1]
    size = last.stat().st_size
    with last.open("r+b") as file:
        file.truncate(size - 100)
    recording = Recording(tmp_path / "rec")
    assert recording.damage.bytes > 0
    assert "bytes unreadable" in recording.damage.summary()
    replay = Replay(recording)
    kept = [(now, live) for now, live in said if now <= recording.end]
    assert len(kept) >= len(said) - 3
    assert _replayed(replay, kept[-1][0]) == kept[-1][1]


def test_a_lost_index_is_rebuilt_from_the_segment(tmp_path: Path) -> None:
    """Without its index (or with a torn one), a segment is scanned: the replay is the same."""
    said = _record(tmp_path / "rec")
    for index in (tmp_path / "rec").glob("*.idx"):
        index.write_bytes(index.read_bytes()[: FILE_HEADER.size + 50])
    replay = Replay(tmp_path / "rec")
    assert replay.recording.damage.indexes_rebuilt == len(replay.recording.segments)
    assert not replay.recording.damage
    assert _replayed(replay, said[-1][0]) == said[-1][1]


def test_a_block_with_a_bad_checksum_is_skipped_and_counted(tmp_path: Path) -> None:
    """A flipped payload byte: that block is skipped (counted), the model is inexact until the next keyframe,
    which puts it right."""
    said = _record(tmp_path / "rec")
    damaged = Recording(tmp_path / "rec").segments[1]
    ops = damaged.entries[1]
    assert ops.kind is BlockKind.OPS
    data = bytearray(damaged.path.read_bytes())
    data[ops.offset + BLOCK_HEADER.size + 5] ^= 0xFF
    damaged.path.write_bytes(bytes(data))
    replay = Replay(tmp_path / "rec")
    cursor = replay.at(said[0][0])
    cursor.advance(ops.t_first)  # its keyframe, then the damaged block: the ops after it are missing
    assert cursor.inexact
    cursor.advance(said[-1][0])
    assert not cursor.inexact
    assert replay.recording.damage.blocks == 1
    model = cursor.model
    assert json.dumps([status_json(model, said[-1][0], 60.0), to_json(model.groups(), None)]) == said[-1][1]


def test_a_damaged_segment_in_the_middle_is_skipped_and_counted_and_the_rest_replays(tmp_path: Path) -> None:
    """A segment whose header is garbage is skipped whole; the segments after it replay exactly."""
    said = _record(tmp_path / "rec")
    segments = sorted((tmp_path / "rec").glob("*.kvr"))
    middle = segments[len(segments) // 2]
    with middle.open("r+b") as file:
        file.write(b"garbage!")
    replay = Replay(tmp_path / "rec")
    assert len(replay.recording.damage.segments_skipped) == 1
    assert "1 segments skipped" in replay.recording.damage.summary()
    assert _replayed(replay, said[-1][0]) == said[-1][1]


def test_another_schema_version_is_a_clear_error(tmp_path: Path) -> None:
    """A segment of schema 99 (another kvtop): UnknownSchema naming both versions, not damage."""
    _record(tmp_path / "rec", passes=5)
    segment = sorted((tmp_path / "rec").glob("*.kvr"))[0]
    data = bytearray(segment.read_bytes())
    struct.pack_into("<H", data, 8, 99)
    struct.pack_into("<I", data, FILE_HEADER.size - 4, checksum(bytes(data[: FILE_HEADER.size - 4])))
    segment.write_bytes(bytes(data))
    with pytest.raises(UnknownSchema, match="recording schema 99, this kvtop reads schema 1"):
        Recording(segment)


def test_a_folder_with_no_recording_is_a_clear_error(tmp_path: Path) -> None:
    """An empty folder (NothingRecorded), a folder of files that are no segments, or a path that is not there:
    RecordingError saying so."""
    with pytest.raises(NothingRecorded, match="nothing recorded in it"):
        Recording(tmp_path)
    (tmp_path / "seg-junk.kvr").write_bytes(b"not a segment")
    with pytest.raises(RecordingError, match="no readable segment"):
        Recording(tmp_path)
    with pytest.raises(RecordingError, match="no such recording"):
        Recording(tmp_path / "missing")


def test_the_ring_deletes_the_oldest_segments_beyond_its_size(tmp_path: Path) -> None:
    """With max_bytes, the oldest whole segments go; what is left starts with a keyframe and replays."""
    said = _record(tmp_path / "rec", passes=80, max_bytes=120_000)
    files = list((tmp_path / "rec").iterdir())
    assert sum(f.stat().st_size for f in files) <= 120_000 + 60_000  # one segment of slack
    replay = Replay(tmp_path / "rec")
    assert replay.start > said[0][0]
    assert _replayed(replay, said[-1][0]) == said[-1][1]


def test_a_keyframe_carries_every_attribute_of_the_model() -> None:
    """A model attribute that keyframes do not know fails here (add it to keyframes.py)."""
    model = ClusterModel()
    assert set(vars(model)) == keyframes.STATE_FIELDS | keyframes.JOURNAL_FIELDS | keyframes.DERIVED_FIELDS


def test_failure_origins_are_listed_without_decoding_the_events(tmp_path: Path) -> None:
    """marks(): one per origin failure, in arrival order; next/previous find the neighbours of a time."""
    said = _record(tmp_path / "rec", passes=20)
    replay = Replay(tmp_path / "rec")
    marks = replay.marks()
    groups = json.loads(said[-1][1])[1]
    assert len(marks) == len([group for group in groups if group["origin"]]) > 0
    middle = marks[len(marks) // 2]
    after = replay.next_origin(middle.arrived)
    assert after is not None and after.arrived > middle.arrived
    before = replay.previous_origin(middle.arrived)
    assert before is None or before.arrived < middle.arrived


def test_an_instant_between_two_runs_of_the_recorder_is_where_nothing_was_recorded(tmp_path: Path) -> None:
    """A folder recorded into twice, 100 s apart: at an instant between the runs the replayed model showed every
    rank gone (their last news before the pause), and `check` paged for a cluster that was healthy throughout."""
    from kvtop.source.errors import SourceError
    from kvtop.source.recording import RecordingSource
    from kvtop.source.spec import SourceSpec
    from kvtop.source.when import When

    folder = tmp_path / "rec"
    first = Recorder(folder, keyframe_events=3000, flush_s=3600.0)
    model = ClusterModel()
    stopped = feed(first, model, CLUSTER, 20, rooms_per_pass=5)
    first.close()
    second = Recorder(folder, keyframe_events=3000, flush_s=3600.0)
    started = stopped + 100.0
    second.tick(model, started)
    feed(second, model, CLUSTER, 20, rooms_per_pass=5, start=started)
    second.close()
    replay = Replay(folder)

    assert replay.unrecorded(stopped + 50.0) == pytest.approx((stopped, started), abs=1.0)
    assert replay.unrecorded(stopped - 0.5) is None and replay.unrecorded(started + 0.5) is None
    spec = SourceSpec(replay=str(folder), when=When(at=stopped + 50.0))
    with pytest.raises(SourceError, match="where the recorder did not run"), RecordingSource.opened(spec):
        pass


def test_a_relays_dead_upstream_replays_and_an_older_account_without_it_still_reads() -> None:
    """The collector's account carries what the relay it subscribed through said of its dead upstream, so a replay
    calls the ranks kept from there unheard, as the live views did (they replayed gone); an account recorded before
    (ten fields) still decodes, with no upstream said."""
    old = msgspec.msgpack.encode([["a", 5.0, {"batches": 3}, {}, {}, [], 0, 0, "", {}]])
    (account,) = OPS_DECODER.decode(old)
    assert isinstance(account, Accounted)
    assert (account.counters, account.upstream_errors, account.upstream_kept) == ({"batches": 3}, [], [])
    model = ClusterModel()
    for label, batch in CLUSTER.hello():
        model.apply(label, batch, 10.0)
    stopped = "relay tcp://rack-1:7101 stopped answering (none within 1.0s)"
    said = Accounted(11.0, {}, {}, {}, [], 0, 0, "", {}, "tcp://relay:7101", [stopped], ["decode-0/TP0"])
    (replayed,) = OPS_DECODER.decode(msgspec.msgpack.encode([said]))
    apply_op(model, replayed)
    states = model.liveness(11.0 + GONE_S + 1)
    assert (states["decode-0/TP0"], states["decode-0/TP1"]) == (Liveness.UNHEARD, Liveness.GONE)
    assert model.intake.upstream_down() == f"upstream stopped answering the relay at tcp://relay:7101: {stopped}"


def test_a_segment_deleted_after_the_recording_was_opened_is_said_not_raised(tmp_path: Path) -> None:
    """A view open on a folder a recorder still writes: its ring deletes the oldest segment, and a seek there
    raised FileNotFoundError (a dashboard rewinding to the start died). The model is inexact and it is said."""
    _record(tmp_path / "rec")
    replay = Replay(tmp_path / "rec")
    oldest = min((tmp_path / "rec").glob("*.kvr"))
    oldest.unlink()
    oldest.with_name(oldest.name + ".idx").unlink()

    cursor = replay.at(replay.start + 0.1)

    assert cursor.inexact
    assert "1 segments gone since it was opened" in replay.recording.damage.summary()
    assert replay.at(replay.end).model.liveness(replay.end)  # the rest still replays


def test_a_segment_missing_between_others_is_said(tmp_path: Path) -> None:
    """A segment deleted by hand or never copied: the replay went from the one before to the one after with
    nothing said, its events lost in silence. The ring's deletions (the oldest first) and a new run (numbered
    from 1 again) are no loss."""
    _record(tmp_path / "rec")
    segments = sorted((tmp_path / "rec").glob("*.kvr"))
    assert len(segments) >= 4
    for path in (segments[2], segments[2].with_name(segments[2].name + ".idx")):
        path.unlink()

    assert "1 segments missing between others" in Recording(tmp_path / "rec").damage.summary()
    ring_then_a_new_run = ["seg-0000000000000003-000003.kvr", "seg-0000000000000004-000004.kvr",
                           "seg-0000000000000009-000001.kvr", "seg-0000000000000010-000002.kvr"]  # fmt: skip
    assert missing_segments(ring_then_a_new_run) == 0
    assert missing_segments(["seg-1-000001.kvr", "seg-2-000004.kvr", "seg-3-000001.kvr", "seg-4-000003.kvr"]) == 3


def test_the_bootstrap_refusals_replay_with_their_role_and_time_for_the_check_to_judge() -> None:
    """A recording kept the refused lines only, so a check on it could not tell a decode rank's refusal a second
    before the replayed instant from a prefill rank's an hour before: their role and time are recorded too."""
    why = "decode-0/TP0: registered from 10.0.0.9, but incarnation 7 from 10.0.0.3 holds it live (from 10.0.0.9)"
    said = Accounted(3611.0, {}, {}, {}, [why], 0, 0, bootstrap_refusals=[(why, "decode", 3610.0)])
    model = ClusterModel()
    (replayed,) = OPS_DECODER.decode(msgspec.msgpack.encode([said]))
    apply_op(model, replayed)

    assert model.intake.refusal_explaining(3611.0, 60.0, "decode") == Refused(why, "decode", 3610.0)
    assert model.intake.refusal_explaining(3611.0, 60.0, "prefill") is None
    assert model.intake.refusal_explaining(3611.0 + 3600, 60.0, "decode") is None


def test_the_bootstrap_replaced_incarnations_replay_by_name_not_only_their_count(tmp_path: Path) -> None:
    """A recording kept the service's `replaced` count but not its named lines: `status --replay` said `1 entries
    taken by a new incarnation` and named none, where the live status named the rank and both incarnations."""
    line = "prefill-0/TP0: incarnation 7 replaced by 8 (from 10.0.0.3)"
    recorder = Recorder(tmp_path / "rec", keyframe_events=3000, flush_s=3600.0)
    model = ClusterModel()
    for label, batch in CLUSTER.hello():
        model.apply(label, batch, 10.0)
    recorder.tick(model, 10.0)  # its keyframe holds none: the account that follows is what says them
    model.intake.bootstrap_counters = {"replaced": 1}
    model.intake.bootstrap_replaced = [line]
    recorder.accounted(model, 10.5)
    recorder.close()

    replayed = Replay(tmp_path / "rec").at(10.5).model
    assert replayed.intake.bootstrap_replaced == [line]
    assert status_json(replayed, 10.5, 60.0)["bootstrap"]["replaced_incarnations"] == [line]


def test_the_records_a_collector_refused_replay_as_rejected_events_with_their_reasons() -> None:
    """A batch some of whose records the subscriber refused is recorded as delivered (the refused left out, so the
    recording decodes), with how many it lost; the collector's account names why: `status --replay` says what the
    live status said."""
    from kvtop.record.records import Delivered

    why = "batch 3, record 2 of 3 (done.seconds): Expected `float` >= 0.0 - at `$[4]`"
    model = ClusterModel()
    label, batch = CLUSTER.hello()[0]
    said = Accounted(10.0, {"records_rejected": 1}, {}, {}, [], 0, 0, records_refused={label: (1, why)})
    for op in OPS_DECODER.decode(msgspec.msgpack.encode([Delivered(10.0, label, batch, refused=1), said])):
        apply_op(model, op)

    status = status_json(model, 10.0, 60.0)
    assert status["rejected_events"] == 1
    assert status["collector"]["records_refused"] == {label: {"count": 1, "latest": why}}


def test_a_ring_whose_latest_run_heard_no_agent_names_the_last_origin_before_it(tmp_path: Path) -> None:
    """A dashboard started on a dead address records a run of no agent into the ring: a view of the ring read at its
    end said only `holds no agent at the instant read`, hiding the run before it. The line names the instant and
    the last failure origin before it, for `--at`."""
    from kvtop.source.recording import RecordingSource
    from kvtop.source.spec import SourceSpec
    from kvtop.views.times import stamp

    folder = tmp_path / "rec"
    first = Recorder(folder, keyframe_events=3000, flush_s=3600.0)
    stopped = feed(first, ClusterModel(), CLUSTER, 20, rooms_per_pass=5)
    first.close()
    second = Recorder(folder, keyframe_events=3000, flush_s=3600.0)
    second.tick(ClusterModel(), stopped + 5.0)
    second.close()
    last = Replay(folder).previous_origin(stopped + 5.0)
    assert last is not None

    with RecordingSource.opened(SourceSpec(replay=str(folder))) as source:
        said = source.nothing_to_judge()

    assert said == (
        f"the recording holds no agent at {stamp(source.now(), dated=True)}, the instant read (its recorder heard "
        f"none); its last failure origin before it arrived at {stamp(last.arrived, dated=True)} (give --at)"
    )
