"""kinv's commands, one module per group, each registering on the one typer app of :mod:`.common`."""
