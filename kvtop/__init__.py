"""kvtop: `top` for the KV transfers of prefill/decode disaggregated LLM serving clusters."""

__version__ = "0.1.0"
