"""Subcommands of `ringzero` that have no package of their own (each module: `add_arguments`, `run`)."""
