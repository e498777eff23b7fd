"""The kvtop plugin that runs inside SGLang's scheduler processes (SGLang itself is imported lazily)."""
