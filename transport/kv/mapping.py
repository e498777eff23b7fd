"""Which prefill ranks serve which decode ranks when the two TP sizes differ.

A logical KV page holds every head; a rank of an instance with TP size `tp`
owns `1/tp` of it, stored as its whole page row. So:

- equal TP: decode rank r pairs with prefill rank r, whole rows;
- decode TP larger (k = dTP/pTP): prefill rank r // k sends decode rank r the
  k-th part of each of its rows, and waits for k transfer requests;
- prefill TP larger (k = pTP/dTP): decode rank r receives from prefill ranks
  r*k .. r*k+k-1, each filling its own part of every decode row, and waits for
  k responses.
"""

from __future__ import annotations

from dataclasses import dataclass

from transport.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Pairing:
    """One prefill rank -> one decode rank: which bytes of each page go where."""

    prefill_rank: int
    decode_rank: int
    src_offset: int
    dst_offset: int
    nbytes: int
    requests_expected: int
    """How many decode ranks the prefill rank waits for in this room."""
    responses_expected: int
    """How many prefill ranks the decode rank waits for in this room."""


def _ratio(big: int, small: int) -> int:
    if big % small:
        raise ConfigError(f"TP sizes {big} and {small} do not divide each other")
    return big // small


def pairings_for_decode_rank(
    decode_rank: int, decode_tp: int, decode_page_bytes: int, prefill_tp: int, prefill_page_bytes: int
) -> list[Pairing]:
    """Every prefill rank that sends to `decode_rank`, with the byte ranges of each."""
    if not 0 <= decode_rank < decode_tp:
        raise ConfigError(f"decode rank {decode_rank} is outside TP size {decode_tp}")
    if decode_tp * decode_page_bytes != prefill_tp * prefill_page_bytes:
        raise ConfigError(
            f"logical page sizes differ: decode {decode_tp}x{decode_page_bytes} B, "
            f"prefill {prefill_tp}x{prefill_page_bytes} B"
        )
    if decode_tp >= prefill_tp:
        k = _ratio(decode_tp, prefill_tp)
        return [
            Pairing(
                prefill_rank=decode_rank // k,
                decode_rank=decode_rank,
                src_offset=(decode_rank % k) * decode_page_bytes,
                dst_offset=0,
                nbytes=decode_page_bytes,
                requests_expected=k,
                responses_expected=1,
            )
        ]
    k = _ratio(prefill_tp, decode_tp)
    return [
        Pairing(
            prefill_rank=decode_rank * k + j,
            decode_rank=decode_rank,
            src_offset=0,
            dst_offset=j * prefill_page_bytes,
            nbytes=prefill_page_bytes,
            requests_expected=1,
            responses_expected=k,
        )
        for j in range(k)
    ]
