"""The ranks a record of a rank heard as taken names, as the views name them.

While another client holds a rank's entry, two live processes claim the rank: the taker (listed, what peers resolve)
and the rank it took the entry from, heard under `prefill-0/TP0~taken` (`transport.registration.taken_label`). Records
name ranks by label alone, so both processes' failures named `prefill-0/TP0`, and incidents counted the taken one's
as the taker's: its origins, its suspects, the silences and crashes looked up for them. A record heard from a taken
rank names itself as its view does, and so each rank heard as taken too (a sidecar's whole server claimed twice, its
ranks all taken: their echoes name one another); any other label stays the listed rank's (peers resolve the taker,
and a record names no incarnation: which process a listed rank meant is not in it).
"""

from __future__ import annotations

from collections.abc import Container

from transport.registration import TAKEN_SUFFIX, taken_label


def as_heard(label: str, heard_as: str, ranks: Container[str]) -> str:
    """`label`, named in a record of the rank heard as `heard_as`, as the views name it (`ranks`: their labels)."""
    if not label or not heard_as.endswith(TAKEN_SUFFIX):
        return label
    taken = taken_label(label)
    return taken if taken == heard_as or taken in ranks else label
