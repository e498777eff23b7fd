"""The one truth every view reads: the cluster model, the fold of failures, and rolling statistics."""
