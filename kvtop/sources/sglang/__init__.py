"""SGLang server logs as a source of the cluster model.

`load(paths, model)` reads the files to their end and returns the `SGLangLogs`
source; call its `poll(model)` again to follow them (`tail -f`, rotation).
Modules: `prefix` (the line prefix), `lines` (line kinds), `reader` (blocks,
follow, rotation, .gz), `infer` (origins), `source` (feeding the model).
"""

from kvtop.sources.sglang.source import Context, LogSpec, LogStats, SGLangLogs, load

__all__ = ["Context", "LogSpec", "LogStats", "SGLangLogs", "load"]
