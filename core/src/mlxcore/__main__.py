"""``python -m mlxcore`` runs the command-line interface."""

from mlxcore.cli.main import main

raise SystemExit(main())
