"""Windows of long lists and lists shipped as changes: what crosses the pipe from the model process."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest

from kvtop.tui.pages import MARGIN_ROWS, NotFetched, Page, PageRequest, Receiver, Shipper


@dataclass(frozen=True)
class Item:
    name: str


def test_a_page_is_as_long_as_its_list_and_holds_only_its_window():
    page = Page.of(list(range(1000)), PageRequest(100, 10))
    assert len(page) == 1000
    assert [page[i] for i in range(100, 110)] == list(range(100, 110))
    with pytest.raises(NotFetched):
        page[99]
    with pytest.raises(IndexError):
        page[1000]


def test_a_tail_request_takes_the_last_rows_and_a_window_past_the_end_is_cut():
    assert Page.of(list(range(50)), PageRequest.tail(5 - MARGIN_ROWS)).rows == [45, 46, 47, 48, 49]
    assert Page.of(list(range(50)), PageRequest(40, 100)).rows == list(range(40, 50))
    assert PageRequest.around(10, 40) == PageRequest(0, 40 + 2 * MARGIN_ROWS)


def test_a_page_survives_pickling():
    page = pickle.loads(pickle.dumps(Page.of(list("abcdef"), PageRequest(2, 2))))
    assert (len(page), page[2], page[3]) == (6, "c", "d")


def test_a_shipped_list_arrives_whole_while_only_its_new_items_travel():
    """Across pickling, as between the processes: the receiver rebuilds each list exactly; an item sent once
    travels as its key alone until it leaves the list; one that left and comes back travels again."""
    shipper, receiver = Shipper[Item](), Receiver[Item]()
    a, b, c, d = Item("a"), Item("b"), Item("c"), Item("d")
    for items, travelled in (([a, b], [a, b]), ([a, b, c], [c]), ([b, c, d], [d]), ([a, d], [a]), ([], [])):
        packed = pickle.loads(pickle.dumps(shipper.pack(items)))
        assert [entry[1] for entry in packed if isinstance(entry, tuple)] == travelled
        assert receiver.unpack(packed) == items


def test_a_receiver_out_of_step_says_so():
    with pytest.raises(KeyError):
        Receiver[Item]().unpack([12345])
