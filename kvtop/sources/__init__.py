"""What feeds the model: the live collector of agents' events, SGLang server logs, and a synthetic cluster."""
