"""The log sidecar: `kvtop agent --sglang-log FILE` turns a live SGLang server's log into kvtop events.

One sidecar per server, on the server's host (as log shippers and exporters are
deployed). It follows the log (`tail`: `tail -f`, rotation by rename or copytruncate,
a file that is not there yet), infers failures, their classes and levels exactly
as the log source does (`kvtop.sources.sglang`), and publishes them on the event
plane per rank (`instance/TPn`), with the envelope, sequence numbers, heartbeats
and snapshots of our own agents (`ranks`, reusing `transport.plane.publisher`). Each rank
registers with a bootstrap service. The fold happens where the sidecars' events
meet, in kvtop's model, so several hosts' sidecars give the groups that reading
their files together gives. `metrics` scrapes the server's Prometheus text into
the heartbeat; `backlog` says what it read of the lines the file held at start;
`sidecar` is the loop. Its command is `kvtop.cli.sidecar_cmd`.
"""
