"""``python -m trainer.migrate``: see trainer.migrate.command."""

from trainer.migrate.command import main

raise SystemExit(main())
