"""The KV data plane: one rank's transfer engine, its prefill and decode sides, pool, rooms and consensus."""
