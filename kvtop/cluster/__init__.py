"""The clusters kvtop starts itself: the demo cluster of `kvtop cluster up` and the embedded one behind bare `kvtop`."""
