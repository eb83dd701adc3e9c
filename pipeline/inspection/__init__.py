"""Looking before doing: checkpoints, GPU fit plans, the CI matrix and the machine's readiness."""
