"""The flight recorder: the collector's model inputs (typed event batches as delivered, with arrival time,
agent and incarnation), in checksummed, zstd-compressed, append-only segments with a time index, plus
keyframes of the model so a seek never replays from the start. See docs/record-api.md."""
