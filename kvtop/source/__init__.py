"""Every source a command reads, behind one interface (`Source`): a live cluster, SGLang logs, a recording, a
running dashboard's model; `open_source` opens the one a frozen `SourceSpec` names.

`kvtop.sources` holds the machinery that builds a model (the collector, the log parser); this package is what
commands read through, above it, the recording and the model process."""

from kvtop.source.base import Events, Gap, Said, Source, Told
from kvtop.source.errors import SourceError
from kvtop.source.opening import open_source
from kvtop.source.spec import ModelChoice, SourceSpec

__all__ = ["Events", "Gap", "ModelChoice", "Said", "Source", "SourceError", "SourceSpec", "Told", "open_source"]
