"""One module per ``agrame`` subcommand: its arguments beside its handler (``add_parser``, ``run``)."""
