"""A running dashboard's model, read by other commands: the model process serves its state on a local socket
(`server`), advertised by a file in a private runtime folder (`runtime`); a headless view given `--model`
finds it and asks (`client`). The frames of that socket are written down once, in `wire`."""
