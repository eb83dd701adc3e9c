"""`python -m pipeline.gateway SETTINGS.json [READY_FILE]`: what `lpx serve` starts beside Triton."""

from .process import main

raise SystemExit(main())
