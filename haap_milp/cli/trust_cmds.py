"""CLI commands (registered on haap_milp.cli.app.app)."""
