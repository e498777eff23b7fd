"""The open panel's follower: what it reads of the journal bit by bit is what a whole read shows, and it answers
only when the panel's text changed."""

from __future__ import annotations

from tui_support import CLUSTER, FIXED_NOW

from kvtop.model.cluster import ClusterModel
from kvtop.tui.details import rank_history, room_timeline
from kvtop.tui.panels import PanelFollower, PanelRequest
from kvtop.tui.rows import Palette
from kvtop.tui.themes import load_themes

PALETTE = Palette.from_theme(load_themes().themes["kvtop-dark"])


def test_a_followed_room_reads_as_a_whole_read_while_the_journal_grows_and_lets_go():
    """A journal of ~600 events, fed ten rooms at a time (a delivery from each rank): each answer is the timeline
    a read of the whole journal gives (its oldest events let go as the journal does), a new version only when the
    text changed."""
    model = ClusterModel(600)
    for label, batch in CLUSTER.hello():
        model.apply(label, batch, FIXED_NOW)
    rounds = [CLUSTER.rooms(10, first=first) for first in range(0, 80, 10)]
    room = next(event.room for event in rounds[0][0][1].events if hasattr(event, "room"))
    follower, shown, versions = PanelFollower(), 0, []
    for deliveries in rounds:
        for label, batch in deliveries:
            model.apply(label, batch, FIXED_NOW)
        body = follower.follow(model, PanelRequest("room", room, PALETTE, shown), FIXED_NOW)
        whole = room_timeline(model, room, FIXED_NOW, PALETTE)
        if body is None:
            assert versions, "the first question is answered"
        else:
            assert body.text == whole
            shown = body.version
            versions.append(shown)
        assert follower.follow(model, PanelRequest("room", room, PALETTE, shown), FIXED_NOW) is None
    assert "(older than the journal" in whole.plain  # the journal let the room's events go: the follower too
    assert len(versions) >= 2 and versions == sorted(set(versions))


def test_a_followed_rank_answers_again_when_another_rank_or_palette_is_asked_for():
    """Another subject or palette is a new text (a new version), and its heartbeats are that rank's alone."""
    model = ClusterModel(10_000)
    for label, batch in CLUSTER.hello() + CLUSTER.rooms(20):
        model.apply(label, batch, FIXED_NOW)
    follower = PanelFollower()
    first = follower.follow(model, PanelRequest("rank", "prefill-0/TP0", PALETTE), FIXED_NOW)
    other = follower.follow(model, PanelRequest("rank", "decode-1/TP1", PALETTE, first.version), FIXED_NOW)
    light = Palette.from_theme(load_themes().themes["kvtop-light"])
    again = follower.follow(model, PanelRequest("rank", "decode-1/TP1", light, other.version), FIXED_NOW)

    assert first.text == rank_history(model, "prefill-0/TP0", FIXED_NOW, PALETTE)
    assert other.text == rank_history(model, "decode-1/TP1", FIXED_NOW, PALETTE)
    assert again.text == rank_history(model, "decode-1/TP1", FIXED_NOW, light)
    assert first.version < other.version < again.version
    assert follower.follow(model, PanelRequest("rank", "no-such/TP9", PALETTE), FIXED_NOW).text.plain == (
        "no-such/TP9: not in the model"
    )
    assert follower.follow(model, PanelRequest("queue", "prefill-0/TP0", PALETTE), FIXED_NOW) is None


def test_a_new_model_of_the_same_subject_is_read_from_its_start():
    """A seek's model is another one, its journal maybe further on: the follower drops the room's events it kept
    of the old model and reads the new one whole (here the room is not in it)."""
    earlier, later = ClusterModel(10_000), ClusterModel(10_000)
    for label, batch in CLUSTER.hello() + CLUSTER.rooms(20):
        earlier.apply(label, batch, FIXED_NOW)
    for label, batch in CLUSTER.hello() * 40:
        later.apply(label, batch, FIXED_NOW)
    room = next(event.room for event in CLUSTER.rooms(20)[0][1].events if hasattr(event, "room"))
    follower = PanelFollower()
    first = follower.follow(earlier, PanelRequest("room", room, PALETTE), FIXED_NOW)
    second = follower.follow(later, PanelRequest("room", room, PALETTE, first.version), FIXED_NOW)

    assert later.journal_total > earlier.journal_total
    assert "Timeline (0 events" not in first.text.plain
    assert second.text == room_timeline(later, room, FIXED_NOW, PALETTE)
    assert "Timeline (0 events" in second.text.plain
