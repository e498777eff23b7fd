"""SGLang server logs as a source of the cluster model.

`load(paths, model)` reads the files to their end and returns the `SGLangLogs`
source; call its `poll(model)` again to follow them (`tail -f`, rotation).
Modules: `prefix` (the line prefix), `lines` (line kinds), `reader` (blocks,
follow, rotation, .gz), `infer` (origins), `convert` (batch lines as heartbeats),
`spec` (`prefill=FILE`), `sniff` (role from content), `naming` (instance names),
`context` (lines shown beside failure groups), `related` (rooms named by the
lines around a failure), `stats` (counts), `source` (feeding the model),
`follow` (the dashboard's thread), `missing` (followed logs gone from their paths).
"""

from kvtop.sources.sglang.context import Context
from kvtop.sources.sglang.source import SGLangLogs, load
from kvtop.sources.sglang.spec import LogSpec
from kvtop.sources.sglang.stats import LogStats

__all__ = ["Context", "LogSpec", "LogStats", "SGLangLogs", "load"]
