"""Sources other than live agents that feed the cluster model (DESIGN.md, "sources")."""
